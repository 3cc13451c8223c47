// Hugging Face model directories: load weights into per-unit flat buffers, and export them back.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/common/files.h"
#include "engine/common/status.h"
#include "engine/model/config.h"
#include "engine/model/param_layout.h"
#include "engine/quant/nf4_unit.h"

namespace slide {

// A model's parameters: one flat 1-D buffer per unit (same dtype and device for all).
struct ModelParams {
  ModelLayout layout;
  std::vector<at::Tensor> units;  // units[i] has layout.units[i].numel elements

  at::Tensor Param(size_t unit, const std::string& local) const;
  // (HF name, view) for every parameter, in layout order.
  std::vector<std::pair<std::string, at::Tensor>> Named() const;
  ModelParams To(at::TensorOptions options) const;  // a deep copy
};

ModelParams ZeroParams(const ModelLayout& layout, at::TensorOptions options);

// The files beside the weights an export copies when the model directory has them (tokenizer, generation config).
const std::vector<std::string>& CompanionFilesCopiedOnExport();

// Reads model.safetensors or a sharded checkpoint (model.safetensors.index.json) from `model_dir`,
// checking every tensor's presence and shape against `cfg`. Values are converted to `dtype`. A checkpoint saved in 4
// bits is INVALID_ARGUMENT here (it trains with adapter: qlora, through LoadHfCheckpointUnits).
// Every tensor refused as NaN or infinite; `interrupted` (when set) is asked between tensors and its error stops
// the load (a job cancelled or suspended while it loads).
StatusOr<ModelParams> LoadHfCheckpoint(const std::string& model_dir, const ModelConfig& cfg, c10::ScalarType dtype,
                                       const std::function<Status()>& interrupted = {});
// One unit as LoadHfCheckpointUnits reads it.
struct LoadedUnit {
  at::Tensor flat;             // the unit's weights in the dtype asked for (undefined when nf4 is set)
  std::optional<Nf4Unit> nf4;  // a decoder layer of a 4-bit bitsandbytes checkpoint, its NF4 arrays as stored
};

// LoadHfCheckpoint one unit at a time, in layout order: `on_unit(u, unit)` gets unit u and owns it; only one unit is
// in memory at once (a QLoRA base is quantised layer by layer as it is read). A checkpoint saved in 4 bits by
// bitsandbytes (engine/quant/bnb_4bit.h) gives its decoder layers as NF4 arrays, read as they are (a projection
// stored unquantised is quantised; norms in `dtype`). The same checks; the first error of `on_unit` stops the load.
Status LoadHfCheckpointUnits(const std::string& model_dir, const ModelConfig& cfg, c10::ScalarType dtype,
                             const std::function<Status(size_t unit, LoadedUnit&& loaded)>& on_unit,
                             const std::function<Status()>& interrupted = {});
// The checks LoadHfCheckpoint makes before reading any data (tensors present with the config's shapes and float
// dtypes, no strangers), from the safetensors headers alone: cheap enough for submission.
Status CheckHfCheckpoint(const std::string& model_dir, const ModelConfig& cfg);
// Whether every element is finite (checked in slices, without a full-size mask).
bool AllFinite(const at::Tensor& t);

struct ExportOptions {
  c10::ScalarType dtype = c10::kBFloat16;
  int64_t max_shard_bytes = 5ll << 30;  // larger models are written as shards plus an index
};

// Writes a directory `from_pretrained` loads: config.json (from `source_model_dir`, dtype updated),
// safetensors weights, and the tokenizer/generation files found in `source_model_dir`.
Status ExportHfCheckpoint(const std::string& out_dir, const std::string& source_model_dir, const ModelParams& params,
                          const ExportOptions& options = {});
// The same into a directory opened once (a job's output directory: written only through its descriptor).
Status ExportHfCheckpoint(const OutputDirectory& out, const std::string& source_model_dir, const ModelParams& params,
                          const ExportOptions& options = {});

}  // namespace slide
