// NF4 weights as tensors, wherever they live: quantisation on the host (nf4.h's routines) and dequantisation by the
// CPU routines for host tensors or by the CUDA kernel (engine/kernels/nf4.cu, on the current stream) for device
// tensors, bit for bit the same.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slide {

// One weight of `numel` elements in bitsandbytes' 4-bit layout (nf4.h): packed uint8 [numel / 2] and its block
// scales, either absmax fp32 [numel / 64] or, double quantised, stats_codes uint8 [numel / 64] with absmax2 fp32
// [ceil(numel / 16384)] and offset (absmax undefined then). All tensors on one device, contiguous.
struct Nf4Tensors {
  int64_t numel = 0;
  at::Tensor packed;
  at::Tensor absmax;
  at::Tensor stats_codes;
  at::Tensor absmax2;
  float offset = 0;

  bool double_quant() const { return stats_codes.defined(); }
  // Bytes the encoding holds (what the planner counts and the PCIe link carries).
  int64_t bytes() const;
  Nf4Tensors To(const c10::Device& device, bool non_blocking = false) const;
};

// Quantises a host tensor (fp32 or bf16; its element count a multiple of 64, which CheckNf4Numel checks at
// submission) as bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=double_quant).
Nf4Tensors QuantizeNf4Tensor(const at::Tensor& x, bool double_quant);

// out: contiguous bf16 or fp32 [w.numel] on w's device.
void DequantizeNf4Into(const Nf4Tensors& w, const at::Tensor& out);

}  // namespace slide
