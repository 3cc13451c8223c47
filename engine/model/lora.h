// LoRA adapters with PEFT's semantics (LoraConfig, bias "none", no rsLoRA, no DoRA): each targeted linear
// projection of a decoder layer computes W x + b + (alpha / r) * B A dropout(x), with the base W frozen and only
// A [r, in] and B [out, r] trained. A layer's adapter is one flat buffer laid out like a unit (ParamLayout), its
// tensors named as PEFT saves them, so the same layout serves the forward, the optimizer, checkpoints and the
// exported adapter_model.safetensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/model/config.h"
#include "engine/model/lora_options.h"
#include "engine/model/param_layout.h"

namespace slide {

// The projections LoRA can target in this model family, in layer order (the names target_modules uses).
const std::vector<std::string>& LoraModuleNames();
// INVALID_ARGUMENT naming the field: r positive and at most each targeted projection's smaller dimension, alpha
// positive and finite, dropout in [0, 1), target modules known, not repeated, at least one.
Status ValidateLoraOptions(const LoraOptions& lora, const ModelConfig& cfg);

// Every layer's adapter: units of kind kAdapter named "adapter.<i>", with per targeted projection
// "<block>.<module>.lora_A.weight" [r, in] and "....lora_B.weight" [out, r] (block self_attn or mlp), full names
// "base_model.model.model.layers.<i>.<block>.<module>.lora_{A,B}.weight" as PEFT saves them. Every adapter matrix
// decays (PEFT under the Hugging Face Trainer decays all but biases and norms).
struct AdapterLayout {
  std::vector<UnitLayout> layers;
  int64_t TotalNumel() const;       // with alignment padding
  int64_t TrainableParams() const;  // without it
};
AdapterLayout BuildAdapterLayout(const ModelConfig& cfg, const LoraOptions& lora);

// A fresh adapter as PEFT initialises one: A Kaiming-uniform with a = sqrt(5) (uniform in +-1/sqrt(in)), drawn from
// `seed`; B zero. One fp32 CPU buffer per layer.
std::vector<at::Tensor> InitAdapter(const AdapterLayout& layout, uint64_t seed);

// What a decoder layer's forward needs of its adapter. The dropout masks are drawn from `dropout_seed` alone, so the
// sliding engine's recompute sees the masks its forward used.
struct LayerAdapter {
  const UnitLayout* layout = nullptr;
  at::Tensor flat;  // the layer's adapter in the compute dtype, on the compute device
  double scale = 1;
  double dropout = 0;  // 0 in evaluation
  uint64_t dropout_seed = 0;
};

// The seed of layer `layer`'s dropout masks in micro-batch `micro_batch` of optimizer step `step` (0-based).
uint64_t AdapterDropoutSeed(uint64_t seed, int64_t step, int64_t micro_batch, int64_t layer);

// x [.., in] -> [.., out]: the adapter's term scale * B A dropout(x) of projection `module_path`
// ("self_attn.q_proj"), or an undefined tensor when that projection is not targeted.
at::Tensor AdapterDelta(const LayerAdapter& adapter, const std::string& module_path, const at::Tensor& x);

// The merged weight W + scale * B A of every targeted projection of one layer, written into `base_flat` (the
// layer's unit buffer, any float dtype; the product is taken in fp32 and rounded once).
void MergeAdapter(const UnitLayout& base_layout, at::Tensor& base_flat, const UnitLayout& adapter_layout,
                  const at::Tensor& adapter_flat, double scale);

}  // namespace slide
