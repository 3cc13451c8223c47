// ReferenceTrainer: the plain mixed-precision trainer the sliding engine must equal. The whole model sits on
// one device; each step copies the fp32 master to the compute dtype, runs every micro-batch through one
// autograd graph, accumulates gradients in fp32, clips by global norm and applies AdamW to the master.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/model/transformer.h"
#include "engine/optim/adamw_reference.h"
#include "engine/optim/lr_schedule.h"
#include "engine/optim/moment_layout.h"

namespace slide {

struct TrainerOptions {
  AdamWHyper adamw;                                 // adamw.lr is overwritten each step from `schedule`
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // adamw_8bit: the moments blockwise 8-bit (adamw_8bit.h)
  LrSchedule schedule;
  double max_grad_norm = 1.0;  // <= 0 disables clipping
  c10::ScalarType compute_dtype = c10::kBFloat16;
  c10::Device device = c10::Device(c10::kCPU);
  LossOptions loss;
};

// One micro-batch: input_ids and targets [b, S] int64; targets are already shifted (targets[t] is the token
// after input_ids[t]) and -100 marks positions without loss.
struct MicroBatch {
  at::Tensor input_ids;
  at::Tensor targets;
};

struct StepStats {
  int64_t step = 0;      // 1-based optimizer step just taken
  double loss = 0;       // mean CE over the step's valid targets
  double grad_norm = 0;  // global L2 norm before clipping
  double lr = 0;         // rate used by this step
  int64_t valid_targets = 0;
};

class ReferenceTrainer {
 public:
  ReferenceTrainer(ModelConfig cfg, ModelParams master_fp32, TrainerOptions options);

  // One optimizer step over `micro_batches` (gradient accumulation = their count).
  StepStats Step(const std::vector<MicroBatch>& micro_batches);

  const ModelParams& master() const { return master_; }
  int64_t steps_taken() const { return step_; }

 private:
  ModelConfig cfg_;
  ModelParams master_;  // fp32, on options_.device
  // The AdamW moments of each unit, laid out by MomentLayout (fp32 [numel], or the 8-bit bytes) on the CPU for
  // adamw_8bit, else on options_.device.
  std::vector<MomentLayout> moment_layout_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  TrainerOptions options_;
  int64_t step_ = 0;
};

// One unit's AdamW step over flat buffers (master, grad [unit.numel]; the moments laid out by `moments`), each
// parameter as the reference does it: fp32 moments in place, 8-bit ones dequantised, stepped, requantised on the
// host. Weight decay only where the parameter's spec asks for it. Shared with the data-parallel reference, whose
// shards are units of their own (engine/parallel/shard_layout.h).
void ReferenceUnitStep(at::Tensor& master, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                       const UnitLayout& unit, const MomentLayout& moments, const AdamWHyper& hp, int64_t step);

// HF-style labels (label[t] is the token at t; the model predicts it from t-1) -> shifted targets.
at::Tensor ShiftLabels(const at::Tensor& labels);

// Global L2 norm over a set of gradient buffers (fp32 math), and in-place scaling by
// min(1, max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ does. Returns the norm before clipping.
double ClipGradNorm(std::vector<at::Tensor>& grads, double max_norm);

}  // namespace slide
