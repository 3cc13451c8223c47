#include "engine/parallel/data_parallel_reference.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "engine/model/transformer.h"

namespace slide {

ElementRange RankRows(int64_t batch, int rank, int world) {
  const int64_t base = batch / world, extra = batch % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

DataParallelReference::DataParallelReference(ModelConfig cfg, const TrainerState& start, TrainerOptions options,
                                             RankGroup& group)
    : cfg_(std::move(cfg)),
      options_(std::move(options)),
      group_(group),
      shards_(start.master.layout, group.world()),
      step_(start.step) {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(options_.device);
  const ModelLayout& layout = start.master.layout;
  TORCH_CHECK(start.exp_avg.empty() || options_.optimizer == OptimizerKind::kAdamW,
              "8-bit moments start from zero in the data-parallel reference");
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitShard& shard = shards_.shard(u, group.rank());
    shard_units_.push_back(MakeShardUnit(layout.units[u], shard));
    moment_layout_.emplace_back(options_.optimizer, shard_units_.back().layout, shard_units_.back().quantized);
    const MomentLayout& m = moment_layout_.back();
    auto slice = [&](const at::Tensor& whole) { return whole.narrow(0, shard.range.begin, shard.range.size()); };
    master_.push_back(slice(start.master.units[u]).to(fp32, /*non_blocking=*/false, /*copy=*/true));
    if (start.exp_avg.empty()) {
      exp_avg_.push_back(at::zeros({m.numel()}, fp32.dtype(m.dtype())));
      exp_avg_sq_.push_back(at::zeros({m.numel()}, fp32.dtype(m.dtype())));
    } else {
      exp_avg_.push_back(slice(start.exp_avg[u]).to(fp32, false, true));
      exp_avg_sq_.push_back(slice(start.exp_avg_sq[u]).to(fp32, false, true));
    }
  }
  weights_ = start.master.To(at::TensorOptions().dtype(options_.compute_dtype).device(options_.device));
}

Status DataParallelReference::GatherUnits(const std::vector<at::Tensor>& shards, std::vector<at::Tensor>& whole,
                                          at::ScalarType dtype) {
  const int world = group_.world();
  for (size_t u = 0; u < shards.size(); ++u) {
    const int64_t cap = shards_.capacity(u);
    at::Tensor mine = at::zeros({cap}, shards[u].options().dtype(dtype));
    mine.narrow(0, 0, shards[u].numel()).copy_(shards[u]);
    at::Tensor all = at::empty({world * cap}, mine.options());
    SLIDE_RETURN_IF_ERROR(group_.AllGather(mine, all));
    for (int r = 0; r < world; ++r) {
      const ElementRange range = shards_.shard(u, r).range;
      whole[u].narrow(0, range.begin, range.size()).copy_(all.narrow(0, r * cap, range.size()));
    }
  }
  return Status::Ok();
}

StatusOr<StepStats> DataParallelReference::Step(const std::vector<MicroBatch>& micro_batches) {
  if (micro_batches.empty()) return InvalidArgument("a step needs at least one micro-batch");
  const int rank = group_.rank(), world = group_.world();
  const auto dev = options_.device;
  std::vector<MicroBatch> mine;
  for (const auto& mb : micro_batches) {
    const ElementRange rows = RankRows(mb.input_ids.size(0), rank, world);
    if (rows.size() > 0) {
      mine.push_back({mb.input_ids.narrow(0, rows.begin, rows.size()), mb.targets.narrow(0, rows.begin, rows.size())});
    }
  }

  // The loss normaliser is the global batch's target count, as the one-rank trainer counts it.
  StepStats stats;
  int64_t targets = 0;
  for (const auto& mb : mine) targets += CheckedTargetCount(mb.targets, cfg_.vocab_size);
  // The small reductions travel as tensors on the ranks' device (NCCL reduces device memory only).
  at::Tensor count = at::full({1}, targets, at::TensorOptions().dtype(at::kLong).device(dev));
  SLIDE_RETURN_IF_ERROR(group_.AllReduceSum(count));
  stats.valid_targets = count.item<int64_t>();
  const double normalizer = std::max<int64_t>(1, stats.valid_targets);

  ModelParams compute = weights_.To(weights_.units.front().options());
  for (auto& t : compute.units) t.requires_grad_(true);
  ModelParams grads = ZeroParams(weights_.layout, at::TensorOptions().dtype(at::kFloat).device(dev));
  double loss = 0;
  for (const auto& mb : mine) {
    at::Tensor l = ModelLoss(cfg_, compute, mb.input_ids.to(dev), mb.targets.to(dev), normalizer, options_.loss);
    l.backward();
    loss += l.item<double>();
    for (size_t u = 0; u < compute.units.size(); ++u) {
      grads.units[u].add_(compute.units[u].grad());
      compute.units[u].mutable_grad().zero_();
    }
  }
  at::Tensor loss_sum = at::full({1}, loss, at::TensorOptions().dtype(at::kDouble).device(dev));
  SLIDE_RETURN_IF_ERROR(group_.AllReduceSum(loss_sum));
  stats.loss = loss_sum.item<double>();

  // Each unit's gradient summed over the ranks into this rank's shard: rank r's part of the padded buffer is its
  // range of the unit (ShardLayout::capacity elements, the tail zero).
  const size_t units = grads.units.size();
  std::vector<at::Tensor> shard_grad(units);
  at::Tensor partial_norms =
      at::empty({static_cast<int64_t>(units)}, at::TensorOptions().dtype(at::kFloat).device(dev));
  for (size_t u = 0; u < units; ++u) {
    const int64_t cap = shards_.capacity(u);
    at::Tensor padded = at::zeros({world * cap}, grads.units[u].options());
    for (int r = 0; r < world; ++r) {
      const ElementRange range = shards_.shard(u, r).range;
      padded.narrow(0, r * cap, range.size()).copy_(grads.units[u].narrow(0, range.begin, range.size()));
    }
    at::Tensor reduced = at::empty({cap}, padded.options());
    SLIDE_RETURN_IF_ERROR(group_.ReduceScatterSum(padded, reduced));
    shard_grad[u] = reduced.narrow(0, 0, master_[u].numel());
    partial_norms[static_cast<int64_t>(u)] = at::linalg_vector_norm(shard_grad[u], 2);
  }

  // Exact clipping: the global norm from every rank's per-unit partial norms (with one rank, the one-rank
  // trainer's computation exactly: the norm of the units' norms).
  at::Tensor all_norms = at::empty({world * static_cast<int64_t>(units)}, partial_norms.options());
  SLIDE_RETURN_IF_ERROR(group_.AllGather(partial_norms, all_norms));
  stats.grad_norm = at::linalg_vector_norm(all_norms, 2).item<double>();
  if (options_.max_grad_norm > 0) {
    const double coef = std::min(1.0, options_.max_grad_norm / (stats.grad_norm + 1e-6));
    for (auto& g : shard_grad) g.mul_(coef);
  }
  stats.lr = options_.schedule.At(step_);
  ++step_;
  stats.step = step_;

  AdamWHyper hp = options_.adamw;
  hp.lr = stats.lr;
  for (size_t u = 0; u < units; ++u) {
    ReferenceUnitStep(master_[u], shard_grad[u], exp_avg_[u], exp_avg_sq_[u], shard_units_[u].layout, moment_layout_[u],
                      hp, step_);
  }
  // The updated weights back to every rank in the compute dtype (what each GPU's slot receives).
  SLIDE_RETURN_IF_ERROR(GatherUnits(master_, weights_.units, options_.compute_dtype));
  return stats;
}

StatusOr<TrainerState> DataParallelReference::Gather() {
  TrainerState state;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(options_.device);
  state.master = ZeroParams(weights_.layout, fp32);
  SLIDE_RETURN_IF_ERROR(GatherUnits(master_, state.master.units, at::kFloat));
  if (options_.optimizer == OptimizerKind::kAdamW) {
    state.exp_avg = ZeroParams(weights_.layout, fp32).units;
    state.exp_avg_sq = ZeroParams(weights_.layout, fp32).units;
    SLIDE_RETURN_IF_ERROR(GatherUnits(exp_avg_, state.exp_avg, at::kFloat));
    SLIDE_RETURN_IF_ERROR(GatherUnits(exp_avg_sq_, state.exp_avg_sq, at::kFloat));
  }
  state.step = step_;
  return state;
}

}  // namespace slide
