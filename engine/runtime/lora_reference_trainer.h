// LoraReferenceTrainer: the plain LoRA trainer that PEFT + torch AdamW are checked against and that the sliding
// engine's adapter mode must equal. The frozen base sits whole on one device in the compute dtype; each layer's
// adapter keeps an fp32 master and AdamW moments beside it. A step copies the adapters to the compute dtype (the
// autograd leaves), runs every micro-batch through one graph, folds the adapter gradients into fp32, clips by their
// global norm and applies AdamW to the adapters alone (decay on every adapter matrix).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/model/lora.h"
#include "engine/runtime/reference_trainer.h"

namespace slide {

class LoraReferenceTrainer {
 public:
  // `base`: the model's weights (any float dtype; converted to options.compute_dtype on options.device).
  // `adapter_fp32`: one flat buffer per layer laid out by BuildAdapterLayout(cfg, lora) (InitAdapter, or a loaded
  // PEFT adapter). options.optimizer must be adamw.
  LoraReferenceTrainer(ModelConfig cfg, const ModelParams& base, std::vector<at::Tensor> adapter_fp32, LoraOptions lora,
                       TrainerOptions options);

  StepStats Step(const std::vector<MicroBatch>& micro_batches);
  // Full logits [B, S, V] fp32 with the current adapters (no dropout).
  at::Tensor Logits(const at::Tensor& ids) const;

  const AdapterLayout& adapter_layout() const { return layout_; }
  const std::vector<at::Tensor>& adapter() const { return master_; }  // fp32, on options.device
  int64_t steps_taken() const { return step_; }

 private:
  // The adapters as the forward takes them (compute copies of the master), with `dropout` and the seeds of
  // micro-batch `micro_batch` of this step.
  std::vector<LayerAdapter> Adapters(const std::vector<at::Tensor>& compute, double dropout, int64_t micro_batch) const;

  ModelConfig cfg_;
  LoraOptions lora_;
  TrainerOptions options_;
  AdapterLayout layout_;
  ModelParams base_;                // compute dtype, frozen
  std::vector<at::Tensor> master_;  // fp32 [layout_.layers[i].numel] per layer
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

}  // namespace slide
