// DataParallelReference: the reference trainer's step spread over the ranks of a RankGroup the way the sliding
// engine's data parallelism is designed (docs/multi-gpu.md), so that design is checked against the one-rank
// reference before the sliding pipeline takes it on. Each rank runs its rows of every micro-batch through the
// whole model (weights in the compute dtype), reduce-scatters the fp32 gradients into its shard of each unit
// (ShardLayout), clips by the global norm gathered from the shards' partial norms, steps AdamW over its shard only
// (master and moments: one copy of the state across the ranks), and all-gathers the updated weights in the
// compute dtype. The state is the whole model's when gathered (TrainerState), so a run resumes onto any rank count.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "engine/common/status.h"
#include "engine/model/config.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/optim/moment_layout.h"
#include "engine/parallel/rank_group.h"
#include "engine/parallel/shard_layout.h"
#include "engine/runtime/reference_trainer.h"

namespace slide {

// The whole model's optimizer state, as a checkpoint holds it. Moments per unit, fp32 [unit numel] (adamw); empty
// for a run that has not stepped yet.
struct TrainerState {
  ModelParams master;  // fp32
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
  int64_t step = 0;
};

// The rows [begin, end) of a micro-batch of `batch` sequences that `rank` of `world` runs: an even split, the
// first ranks taking one more where it does not divide (a rank may have none).
ElementRange RankRows(int64_t batch, int rank, int world);

class DataParallelReference {
 public:
  // Every rank passes the same starting state and options; each keeps its shards of the state. 8-bit moments step
  // (their blocks never cut: ShardLayout) but only start from zero and are not gathered yet.
  DataParallelReference(ModelConfig cfg, const TrainerState& start, TrainerOptions options, RankGroup& group);

  // One optimizer step over the global batch `micro_batches` (the same on every rank); this rank computes its
  // RankRows of each. Collective: every rank calls it. The stats are the global step's, equal on every rank.
  StatusOr<StepStats> Step(const std::vector<MicroBatch>& micro_batches);

  // Collective: the whole model's state from every rank's shards (the moments with fp32 AdamW only: 8-bit ones are
  // left out, so such a state shows the weights but does not resume).
  StatusOr<TrainerState> Gather();

  int64_t steps_taken() const { return step_; }

 private:
  Status GatherUnits(const std::vector<at::Tensor>& shards, std::vector<at::Tensor>& whole, at::ScalarType dtype);

  ModelConfig cfg_;
  TrainerOptions options_;
  RankGroup& group_;
  ShardLayout shards_;
  std::vector<ShardUnit> shard_units_;       // [unit]: this rank's shard as a unit for the optimizer
  std::vector<MomentLayout> moment_layout_;  // [unit]: its moments' layout
  std::vector<at::Tensor> master_;           // [unit]: fp32 [shard size]
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  ModelParams weights_;  // the whole model in the compute dtype, as the last all-gather left it
  int64_t step_ = 0;
};

}  // namespace slide
