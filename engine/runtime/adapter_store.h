// AdapterStore: a sliding trainer's LoRA adapters in adapter mode, all of them on the device. One allocation per
// tensor class, each layer's adapter a view into it (AdapterLayout, llm.c style):
//   master       fp32 [total]   what AdamW updates
//   exp_avg/_sq  fp32 [total]   its moments
//   grad         fp32 [total]   the step's gradient, summed over micro-batches
//   weights      compute dtype [total]   what the forward reads (the master itself for fp32 compute)
// They never leave the device but for checkpoints and the export. The update is the LoRA reference trainer's: the
// global norm over every layer's gradient (ClipGradNorm), then AdamW over each layer's buffer (every adapter matrix
// decays; the padding between views stays zero), so the CPU result is bit-identical to LoraReferenceTrainer's.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/common/status.h"
#include "engine/model/lora.h"
#include "engine/optim/adamw_reference.h"

namespace slide {

class AdapterStore {
 public:
  // `device_opts`: the compute dtype on the training device. The adapter starts as InitAdapter(lora.seed) would.
  AdapterStore(const ModelConfig& cfg, LoraOptions lora, const at::TensorOptions& device_opts);

  const LoraOptions& lora() const { return lora_; }
  const AdapterLayout& layout() const { return layout_; }
  int64_t layers() const { return static_cast<int64_t>(layout_.layers.size()); }

  // Layer `layer`'s adapter as the forward takes it: its weights (no gradient), or a fresh leaf that requires one
  // (the recompute), with `dropout` and the masks' seed.
  LayerAdapter Forward(int64_t layer, double dropout, uint64_t seed) const;
  at::Tensor Leaf(int64_t layer) const;
  LayerAdapter WithLeaf(int64_t layer, const at::Tensor& leaf, double dropout, uint64_t seed) const;

  void ZeroGrad();
  void LandGrad(int64_t layer, const at::Tensor& grad);  // added into the fp32 sum
  // Global L2 norm of the gradient before clipping; scales it by min(1, max_norm / (norm + 1e-6)) when max_norm > 0.
  double ClipGradNorm(double max_norm);
  // AdamW (`hp.lr` this step's rate, `step` 1-based) over every layer, then the forward's weights from the master.
  void Update(const AdamWHyper& hp, int64_t step);

  // Checkpoint state of one layer: kind 0 master, 1 exp_avg, 2 exp_avg_sq (fp32 [layout.layers[layer].numel]), as a
  // CPU copy; WriteState checks the shape and values, then refreshes the forward's weights.
  at::Tensor ReadState(int kind, int64_t layer) const;
  Status WriteState(int kind, int64_t layer, const at::Tensor& src);
  std::vector<at::Tensor> MasterOnHost() const;  // fp32 CPU, one buffer per layer (the export)
  int64_t device_bytes() const;

 private:
  at::Tensor View(const at::Tensor& all, int64_t layer) const;

  LoraOptions lora_;
  AdapterLayout layout_;
  std::vector<int64_t> offset_;  // each layer's start in the [total] buffers
  at::Tensor master_, exp_avg_, exp_avg_sq_, grad_, weights_;
};

}  // namespace slide
