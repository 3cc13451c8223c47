#include "engine/optim/moment_layout.h"

#include "engine/optim/adamw_8bit.h"

namespace slide {

int64_t MomentLayout::Blocks(int64_t numel) { return (numel + kQuantBlock - 1) / kQuantBlock; }

MomentLayout::MomentLayout(OptimizerKind kind, const UnitLayout& unit) : kind_(kind) {
  params_.resize(unit.params.size());
  if (kind == OptimizerKind::kAdamW) {
    for (size_t i = 0; i < unit.params.size(); ++i) params_[i].values = 4 * unit.params[i].offset;
    bytes_ = 4 * unit.numel;
    float_values_ = unit.numel;
    return;
  }
  // Three passes so that every fp32 array starts 4-byte aligned: the small parameters' moments, the absmax
  // arrays, then the codes.
  int64_t at = 0;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    params_[i].quantized = unit.params[i].numel >= kMin8BitStateNumel;
    if (params_[i].quantized) continue;
    params_[i].values = at;
    at += 4 * unit.params[i].numel;
  }
  for (size_t i = 0; i < unit.params.size(); ++i) {
    if (!params_[i].quantized) continue;
    params_[i].absmax = at;
    at += 4 * Blocks(unit.params[i].numel);
  }
  float_values_ = at / 4;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    if (!params_[i].quantized) continue;
    params_[i].values = at;
    at += unit.params[i].numel;
  }
  bytes_ = at;
}

int64_t MomentBytes(OptimizerKind kind, const ModelLayout& layout, const std::vector<bool>& counted) {
  int64_t bytes = 0;
  for (size_t u = 0; u < layout.units.size(); ++u)
    if (counted[u]) bytes += 2 * MomentLayout(kind, layout.units[u]).bytes();
  return bytes;
}

}  // namespace slide
