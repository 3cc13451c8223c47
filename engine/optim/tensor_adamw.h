// AdamW on flat tensors wherever they live: the fused CPU body for host tensors, the CUDA kernel (on the current
// stream) for device tensors. Both run the same arithmetic, bit for bit, so a unit updated on the device trains
// exactly as one updated on the host.
#pragma once

#include <ATen/core/Tensor.h>

#include "engine/optim/cpu_adamw.h"

namespace slide {

// param, exp_avg, exp_avg_sq: fp32 [n], contiguous, on one device; grad: bf16 or fp32 [n] on the same device;
// out: an optional bf16 [n] that receives the updated weight (undefined: none). On the CPU `simd` picks the body.
void TensorAdamW(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                 const at::Tensor& grad, const at::Tensor& out, const AdamWStepArgs& args, SimdLevel simd);

// The 8-bit moments' update (adamw_8bit.h) on flat tensors wherever they live: CpuAdamW8bit for host tensors, the
// CUDA kernel for device tensors, bit for bit the same. param fp32 [n]; exp_avg, exp_avg_sq uint8 [n] (codes);
// exp_avg_absmax, exp_avg_sq_absmax fp32 [ceil(n / 256)]; grad and out as for TensorAdamW.
void TensorAdamW8bit(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_absmax,
                     const at::Tensor& exp_avg_sq, const at::Tensor& exp_avg_sq_absmax, const at::Tensor& grad,
                     const at::Tensor& out, const AdamWStepArgs& args, SimdLevel simd);

}  // namespace slide
