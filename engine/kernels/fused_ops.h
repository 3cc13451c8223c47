// The model's elementwise and normalisation ops, each as one fused CUDA kernel (engine/kernels/*.cu) on CUDA
// tensors in fp32 or bf16, and as the unfused LibTorch ops everywhere else (the CPU fallback, and the reference
// the kernels are checked against). All are differentiable with autograd.
#pragma once

#include <ATen/core/Tensor.h>

namespace slide {

// Process-wide switch (on by default) so that benchmarks and tests can compare with and without the kernels.
void SetFusedKernelsEnabled(bool enabled);
// True when the kernels are compiled in and switched on.
bool FusedKernelsEnabled();
// True when the fused kernel runs for `x`: enabled, on a CUDA device, fp32 or bf16.
bool UseFusedKernels(const at::Tensor& x);

// RMSNorm over the last dimension: weight * T(x * rsqrt(mean(x^2) + eps)) with the statistics in fp32.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor RmsNormUnfused(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotary embedding of x [B, S, heads, D] with the tables cos, sin [S, D] (the result keeps x's layout).
at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor ApplyRotaryUnfused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up.
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor SwiGluUnfused(const at::Tensor& gate, const at::Tensor& up);

// dtype conversion (round to nearest even for bf16): the kernel for fp32 <-> bf16 on CUDA, Tensor::to otherwise.
at::Tensor ConvertDtype(const at::Tensor& x, at::ScalarType dtype);

// The two row operations of the chunked cross-entropy (both forms in lm_head_loss.cc). logits [rows, cols] hold
// vocabulary ids [vocab_offset, vocab_offset + cols); targets [rows] int64, outside [0, vocab) = ignored.
// Stats folds the chunk into run_max / run_sum (fp32 [rows]) and records the target's logit in picked.
void CrossEntropyChunkStats(const at::Tensor& logits, int64_t vocab_offset, const at::Tensor& targets, int64_t vocab,
                            at::Tensor& run_max, at::Tensor& run_sum, at::Tensor& picked);
// Grad rewrites logits in place as (softmax - onehot) * scale, zero on ignored rows; lse fp32 [rows].
void CrossEntropyChunkGrad(at::Tensor& logits, int64_t vocab_offset, const at::Tensor& targets, int64_t vocab,
                           const at::Tensor& lse, double scale);

}  // namespace slide
