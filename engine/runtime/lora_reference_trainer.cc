#include "engine/runtime/lora_reference_trainer.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

namespace slide {

LoraReferenceTrainer::LoraReferenceTrainer(ModelConfig cfg, const ModelParams& base,
                                           std::vector<at::Tensor> adapter_fp32, LoraOptions lora,
                                           TrainerOptions options)
    : cfg_(std::move(cfg)), lora_(std::move(lora)), options_(std::move(options)) {
  TORCH_CHECK(options_.optimizer == OptimizerKind::kAdamW, "the LoRA reference trainer runs fp32 AdamW");
  layout_ = BuildAdapterLayout(cfg_, lora_);
  TORCH_CHECK(adapter_fp32.size() == layout_.layers.size(), "one adapter buffer per layer is needed");
  base_ = base.To(at::TensorOptions().dtype(options_.compute_dtype).device(options_.device));
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(options_.device);
  for (size_t i = 0; i < adapter_fp32.size(); ++i) {
    TORCH_CHECK(adapter_fp32[i].numel() == layout_.layers[i].numel, "adapter ", i, " does not match its layout");
    master_.push_back(adapter_fp32[i].to(fp32, /*non_blocking=*/false, /*copy=*/true));
    exp_avg_.push_back(at::zeros({layout_.layers[i].numel}, fp32));
    exp_avg_sq_.push_back(at::zeros({layout_.layers[i].numel}, fp32));
  }
}

std::vector<LayerAdapter> LoraReferenceTrainer::Adapters(const std::vector<at::Tensor>& compute, double dropout,
                                                         int64_t micro_batch) const {
  std::vector<LayerAdapter> out;
  for (size_t i = 0; i < compute.size(); ++i)
    out.push_back({&layout_.layers[i], compute[i], lora_.scale(), dropout,
                   AdapterDropoutSeed(lora_.seed, step_, micro_batch, static_cast<int64_t>(i))});
  return out;
}

StepStats LoraReferenceTrainer::Step(const std::vector<MicroBatch>& micro_batches) {
  TORCH_CHECK(!micro_batches.empty(), "a step needs at least one micro-batch");
  StepStats stats;
  for (const auto& mb : micro_batches) stats.valid_targets += CheckedTargetCount(mb.targets, cfg_.vocab_size);
  const double normalizer = std::max<int64_t>(1, stats.valid_targets);

  std::vector<at::Tensor> compute, grads;
  for (const at::Tensor& m : master_) {
    // A copy even in fp32: the leaf must not be the master that AdamW updates in place.
    compute.push_back(m.to(options_.compute_dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
    grads.push_back(at::zeros_like(m));
  }
  // The loss summed in fp32 on the device, as the sliding trainer sums it, so the two report the same value.
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const MicroBatch& mb = micro_batches[k];
    const std::vector<LayerAdapter> adapters = Adapters(compute, lora_.dropout, static_cast<int64_t>(k));
    at::Tensor loss = ModelLoss(cfg_, base_, mb.input_ids.to(options_.device), mb.targets.to(options_.device),
                                normalizer, options_.loss, &adapters);
    loss.backward();
    loss_sum.add_(loss.detach());
    for (size_t i = 0; i < compute.size(); ++i) {
      grads[i].add_(compute[i].grad());
      compute[i].mutable_grad().zero_();
    }
  }

  stats.loss = loss_sum.item<double>();
  stats.grad_norm = ClipGradNorm(grads, options_.max_grad_norm);
  stats.lr = options_.schedule.At(step_);
  ++step_;
  stats.step = step_;
  AdamWHyper hp = options_.adamw;
  hp.lr = stats.lr;
  // Every adapter matrix decays, so each layer's buffer takes one AdamW call (its zero padding stays zero).
  for (size_t i = 0; i < master_.size(); ++i)
    AdamWReferenceStep(master_[i], grads[i], exp_avg_[i], exp_avg_sq_[i], hp, step_);
  return stats;
}

at::Tensor LoraReferenceTrainer::Logits(const at::Tensor& ids) const {
  c10::InferenceMode no_grad;
  std::vector<at::Tensor> compute;
  for (const at::Tensor& m : master_) compute.push_back(m.to(options_.compute_dtype));
  const std::vector<LayerAdapter> adapters = Adapters(compute, /*dropout=*/0, 0);
  return ModelLogits(cfg_, base_, ids.to(options_.device), &adapters);
}

}  // namespace slide
