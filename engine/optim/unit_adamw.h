// AdamW over one unit's flat buffers (see ParamLayout), parameter by parameter: each parameter takes the step's
// arguments, without weight decay where it takes none (norms, biases). The host body updates any element range of
// the unit (the NVMe tier hands it chunks, weights first hands it ring-sized pieces of the edge units); the device
// body updates a resident unit where it lives. Both run TensorAdamW's arithmetic, so either is bit-identical to
// the reference optimizer.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

#include "engine/model/param_layout.h"
#include "engine/optim/cpu_adamw.h"
#include "engine/optim/moment_layout.h"

namespace slide {

// A parameter's step arguments: the unit's, with weight decay 0 where the parameter takes none.
AdamWStepArgs ParamStepArgs(const ParamSpec& spec, const AdamWStepArgs& unit_args);

// Elements [begin, begin + n) of a host unit. master, exp_avg and exp_avg_sq point at element `begin` (a chunk
// of the state); grad (bf16 or fp32) and weights_out cover the whole unit.
struct HostUnitRange {
  int64_t begin = 0, n = 0;
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  at::Tensor grad;         // [unit numel]
  at::Tensor weights_out;  // [unit numel], the compute-dtype weights the forward loads; may alias the master
  // The weights-only pass: only the bf16 weights are written, at weights_only_out (element `begin`); the master
  // and the moments are read.
  c10::BFloat16* weights_only_out = nullptr;
};
void HostUnitAdamW(const UnitLayout& unit, const HostUnitRange& range, const AdamWStepArgs& args, SimdLevel simd);

// A host unit with 8-bit moments (`moments`, adamw_8bit): the whole unit's update (begin 0, n the unit's numel:
// quantisation blocks are requantised whole), or with weights_only_out the weights-only pass over any range.
// master points at element `begin`; exp_avg and exp_avg_sq are the whole moment buffers (MomentLayout bytes).
struct HostUnit8bitRange {
  int64_t begin = 0, n = 0;
  float* master = nullptr;
  uint8_t* exp_avg = nullptr;
  uint8_t* exp_avg_sq = nullptr;
  at::Tensor grad;         // [unit numel]
  at::Tensor weights_out;  // [unit numel], as HostUnitRange's
  c10::BFloat16* weights_only_out = nullptr;
};
void HostUnitAdamW8bit(const UnitLayout& unit, const MomentLayout& moments, const HostUnit8bitRange& range,
                       const AdamWStepArgs& args, SimdLevel simd);

// One parameter's AdamW on tensors wherever they live (TensorAdamW, or TensorAdamW8bit for 8-bit moments): its fp32
// master, gradient and optional bf16 weights ([numel] each), and its moments where `where` puts them in the two moment
// buffers (read as bytes: fp32 values, or 8-bit codes and their absmax).
void ParamAdamW(const MomentLayout::Param& where, const at::Tensor& master, const at::Tensor& exp_avg,
                const at::Tensor& exp_avg_sq, const at::Tensor& grad, const at::Tensor& weights_bf16,
                const AdamWStepArgs& args, SimdLevel simd);

// A unit on the device, whole: fp32 master, the moments as `moments` lays them out (fp32 [numel], or the 8-bit
// buffers of MomentLayout bytes), the gradient, and the bf16 weights (undefined with fp32 compute, where the master is
// what the forward reads). On the current stream.
void DeviceUnitAdamW(const UnitLayout& unit, const MomentLayout& moments, const at::Tensor& master,
                     const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& grad,
                     const at::Tensor& weights_bf16, const AdamWStepArgs& args, SimdLevel simd);

}  // namespace slide
