#include "engine/runtime/reference_trainer.h"

#include <ATen/ATen.h>

#include <cmath>

namespace slide {

at::Tensor ShiftLabels(const at::Tensor& labels) {
  at::Tensor targets = at::full_like(labels, kIgnoreIndex);
  const int64_t S = labels.size(1);
  targets.narrow(1, 0, S - 1).copy_(labels.narrow(1, 1, S - 1));
  return targets;
}

double ClipGradNorm(std::vector<at::Tensor>& grads, double max_norm) {
  std::vector<at::Tensor> norms;
  for (const auto& g : grads) norms.push_back(at::linalg_vector_norm(g.to(at::kFloat), 2));
  const double total = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
  if (max_norm > 0) {
    const double coef = std::min(1.0, max_norm / (total + 1e-6));
    for (auto& g : grads) g.mul_(coef);
  }
  return total;
}

ReferenceTrainer::ReferenceTrainer(ModelConfig cfg, ModelParams master_fp32, TrainerOptions options)
    : cfg_(std::move(cfg)), options_(std::move(options)) {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(options_.device);
  master_ = master_fp32.To(fp32);
  exp_avg_ = ZeroParams(master_.layout, fp32);
  exp_avg_sq_ = ZeroParams(master_.layout, fp32);
}

StepStats ReferenceTrainer::Step(const std::vector<MicroBatch>& micro_batches) {
  TORCH_CHECK(!micro_batches.empty(), "a step needs at least one micro-batch");
  StepStats stats;
  for (const auto& mb : micro_batches) stats.valid_targets += CheckedTargetCount(mb.targets, cfg_.vocab_size);
  const double normalizer = std::max<int64_t>(1, stats.valid_targets);

  // Compute-dtype copies of the master are the autograd leaves; their grads are folded into fp32 after each
  // micro-batch so accumulation never happens in bf16.
  ModelParams compute = master_.To(at::TensorOptions().dtype(options_.compute_dtype).device(options_.device));
  for (auto& t : compute.units) t.requires_grad_(true);
  ModelParams grads = ZeroParams(master_.layout, at::TensorOptions().dtype(at::kFloat).device(options_.device));

  for (const auto& mb : micro_batches) {
    at::Tensor loss = ModelLoss(cfg_, compute, mb.input_ids.to(options_.device), mb.targets.to(options_.device),
                                normalizer, options_.loss);
    loss.backward();
    stats.loss += loss.item<double>();
    for (size_t u = 0; u < compute.units.size(); ++u) {
      grads.units[u].add_(compute.units[u].grad());
      compute.units[u].mutable_grad().zero_();
    }
  }

  stats.grad_norm = ClipGradNorm(grads.units, options_.max_grad_norm);
  stats.lr = options_.schedule.At(step_);
  ++step_;
  stats.step = step_;

  AdamWHyper hp = options_.adamw;
  hp.lr = stats.lr;
  for (size_t u = 0; u < master_.layout.units.size(); ++u) {
    for (const auto& spec : master_.layout.units[u].params) {
      AdamWHyper p_hp = hp;
      if (!spec.weight_decay) p_hp.weight_decay = 0;
      at::Tensor p = ParamView(spec, master_.units[u]);
      at::Tensor m = ParamView(spec, exp_avg_.units[u]);
      at::Tensor v = ParamView(spec, exp_avg_sq_.units[u]);
      AdamWReferenceStep(p, ParamView(spec, grads.units[u]), m, v, p_hp, step_);
    }
  }
  return stats;
}

}  // namespace slide
