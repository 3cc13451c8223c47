// Where one unit's AdamW moments live, for each optimizer. A unit keeps each moment (exp_avg, exp_avg_sq) in one
// buffer; this says how that buffer is laid out, parameter by parameter, so the store, the checkpoint, the planner
// and the update agree on it:
//   adamw       fp32 [unit numel]: a parameter's moment at its own element offset (padding included, never read)
//   adamw_8bit  bytes [fp32 moments of the parameters under kMin8BitStateNumel | fp32 absmax of every block of
//               kQuantBlock elements, per quantised parameter | one uint8 code per element of those parameters]
//               (see adamw_8bit.h). Quantised parameters' blocks start at the parameter's first element.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/param_layout.h"
#include "engine/optim/optimizer_kind.h"

namespace slide {

class MomentLayout {
 public:
  struct Param {
    bool quantized = false;
    int64_t values = 0;  // byte offset: fp32 moments [numel], or uint8 codes [numel] when quantized
    int64_t absmax = 0;  // byte offset of fp32 absmax [Blocks(numel)] when quantized
  };

  MomentLayout() = default;
  MomentLayout(OptimizerKind kind, const UnitLayout& unit);
  // adamw_8bit with each parameter's quantisation given (a data-parallel shard's pieces: decided by the whole
  // parameter, QuantizedMoments of its numel).
  MomentLayout(OptimizerKind kind, const UnitLayout& unit, const std::vector<bool>& quantized);

  OptimizerKind kind() const { return kind_; }
  // The buffer of one moment: `numel()` elements of `dtype()` (fp32 for adamw, bytes for adamw_8bit).
  c10::ScalarType dtype() const { return kind_ == OptimizerKind::kAdamW ? c10::kFloat : c10::kByte; }
  int64_t numel() const { return kind_ == OptimizerKind::kAdamW ? bytes_ / 4 : bytes_; }
  int64_t bytes() const { return bytes_; }
  int64_t float_values() const { return float_values_; }        // fp32 values first in the buffer (all of it for adamw)
  const std::vector<Param>& params() const { return params_; }  // in UnitLayout::params order

  static int64_t Blocks(int64_t numel);  // quantisation blocks of a parameter of `numel` elements

 private:
  OptimizerKind kind_ = OptimizerKind::kAdamW;
  int64_t bytes_ = 0, float_values_ = 0;
  std::vector<Param> params_;
};

// Whether a parameter of `numel` elements keeps 8-bit moments under adamw_8bit (smaller ones keep fp32, as
// bitsandbytes does).
bool QuantizedMoments(int64_t numel);

// Host bytes of both moments of a model's units (those `counted` selects), for the planner.
int64_t MomentBytes(OptimizerKind kind, const ModelLayout& layout, const std::vector<bool>& counted);

}  // namespace slide
