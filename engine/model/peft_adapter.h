// LoRA adapters in PEFT's files: a directory with adapter_config.json and adapter_model.safetensors, as
// PeftModel.save_pretrained writes them and PeftModel.from_pretrained and vLLM's LoRA loader read them.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "engine/common/files.h"
#include "engine/common/status.h"
#include "engine/model/config.h"
#include "engine/model/lora.h"

namespace slide {

struct PeftAdapter {
  LoraOptions lora;
  std::vector<at::Tensor> layers;  // fp32 CPU, one flat buffer per layer (BuildAdapterLayout(cfg, lora))
};

// Reads an adapter for `cfg`. INVALID_ARGUMENT naming the file and field for what this engine does not train
// (another peft_type, DoRA, rsLoRA, biases, per-module ranks or alphas, a subset of layers, modules to save, a
// target that is not one of the model's projections) and for tensors missing, extra, misshapen or not finite.
StatusOr<PeftAdapter> LoadPeftAdapter(const std::string& dir, const ModelConfig& cfg);

// adapter_config.json's text for `lora` (PEFT's LORA config for a causal LM; `base_model` as given).
std::string PeftAdapterConfigJson(const LoraOptions& lora, const std::string& base_model);

// Writes adapter_config.json and adapter_model.safetensors (fp32 by default, PEFT's names) into `out`.
Status ExportPeftAdapter(const OutputDirectory& out, const LoraOptions& lora, const AdapterLayout& layout,
                         const std::vector<at::Tensor>& layers, const std::string& base_model,
                         c10::ScalarType dtype = c10::kFloat);

}  // namespace slide
