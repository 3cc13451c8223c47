// ParamLayout: how a model's parameters are grouped into units and packed into one flat buffer per unit.
// Units are what the sliding engine moves: [embedding, layer 0 .. layer L-1, head (final norm [+ LM head])].
// Each unit's tensors are views into one contiguous buffer, so a unit moves, updates and checkpoints as one
// block; offsets are aligned so every view starts on a 128-byte boundary for bf16 (64 elements).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/config.h"

namespace slide {

constexpr int64_t kParamAlignElems = 64;

struct ParamSpec {
  std::string name;            // Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::string local;           // name inside the unit, e.g. "self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // as stored by Hugging Face ([out, in] for linear weights)
  int64_t offset = 0;          // elements from the start of the unit's buffer
  int64_t numel = 0;
  bool weight_decay = false;  // matrices decay; norms and biases do not
};

enum class UnitKind { kEmbedding, kDecoderLayer, kHead, kAdapter };

struct UnitLayout {
  UnitKind kind = UnitKind::kDecoderLayer;
  std::string name;  // "embed", "layer.3", "head"
  std::vector<ParamSpec> params;
  int64_t numel = 0;  // buffer length including alignment padding (padding stays zero)

  const ParamSpec* Find(const std::string& local) const;
};

struct ModelLayout {
  std::vector<UnitLayout> units;  // embed, layers..., head
  bool tied_embeddings = false;   // the head's LM head is the embedding unit's matrix

  int64_t num_layers() const { return static_cast<int64_t>(units.size()) - 2; }
  const UnitLayout& embed() const { return units.front(); }
  const UnitLayout& layer(int64_t i) const { return units[1 + i]; }
  const UnitLayout& head() const { return units.back(); }
  int64_t TotalNumel() const;
};

ModelLayout BuildModelLayout(const ModelConfig& cfg);

// Packs a unit's parameters one after another, each view aligned (kParamAlignElems); names are prefix + local.
class UnitBuilder {
 public:
  UnitBuilder(UnitKind kind, std::string name, std::string prefix);
  void Add(const std::string& local, std::vector<int64_t> shape, bool decay);
  UnitLayout Take() { return std::move(unit_); }

 private:
  std::string prefix_;
  UnitLayout unit_;
};

// Views of each named parameter inside `flat` (1-D, length layout.numel), in layout order.
std::vector<at::Tensor> UnitViews(const UnitLayout& layout, const at::Tensor& flat);
at::Tensor ParamView(const ParamSpec& spec, const at::Tensor& flat);

}  // namespace slide
