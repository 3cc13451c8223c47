#include "engine/optim/moment_layout.h"

#include <c10/util/Exception.h>

#include "engine/optim/adamw_8bit.h"

namespace slide {

int64_t MomentLayout::Blocks(int64_t numel) { return (numel + kQuantBlock - 1) / kQuantBlock; }

bool QuantizedMoments(int64_t numel) { return numel >= kMin8BitStateNumel; }

namespace {
std::vector<bool> QuantizedByNumel(const UnitLayout& unit) {
  std::vector<bool> q;
  for (const ParamSpec& p : unit.params) q.push_back(QuantizedMoments(p.numel));
  return q;
}
}  // namespace

MomentLayout::MomentLayout(OptimizerKind kind, const UnitLayout& unit)
    : MomentLayout(kind, unit, QuantizedByNumel(unit)) {}

MomentLayout::MomentLayout(OptimizerKind kind, const UnitLayout& unit, const std::vector<bool>& quantized)
    : kind_(kind) {
  TORCH_CHECK(quantized.size() == unit.params.size(), "MomentLayout: one quantisation flag a parameter");
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
    params_[i].quantized = quantized[i];
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
