// Host launchers of the project's CUDA kernels (engine/kernels/*.cu). Plain pointers and sizes, no LibTorch
// types: fused_ops.cc wraps them for tensors and autograd. Every pointer is device memory, every matrix is
// row-major and contiguous, and every launcher enqueues on `stream` and returns the launch's error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/optim/adamw_scalars.h"

namespace slide::cuda {

enum class DType { kFloat, kBFloat16 };

// y = T(T(x * rstd) * w) per row, rstd = rsqrt(mean(x^2) + eps) in fp32 (saved for the backward).
// x, y [rows, cols]; w [cols]; rstd [rows].
cudaError_t RmsNormForward(DType t, const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols,
                           float eps, cudaStream_t stream);

// dx = rstd * (dn - n * mean(dn * n)) with n = x * rstd, dn = T(dy * w); dw = sum over rows of dy * T(n),
// accumulated in fp32. `partial` is scratch of RmsNormPartialRows(rows) * cols floats.
int RmsNormPartialRows(int64_t rows);
cudaError_t RmsNormBackward(DType t, const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                            void* dw, float* partial, int64_t rows, int64_t cols, cudaStream_t stream);

// Rotary embedding of x [tokens, heads, dim] (tokens = batch * seq, position = token % seq) with the tables
// cos, sin [seq, dim]: y[:half] = x[:half] cos - x[half:] sin, y[half:] = x[half:] cos + x[:half] sin.
// `backward` applies the transpose (dy -> dx).
cudaError_t Rope(DType t, const void* x, const void* cos, const void* sin, void* y, int64_t tokens, int64_t seq,
                 int64_t heads, int64_t dim, bool backward, cudaStream_t stream);

// out = silu(gate) * up over n elements; the backward gives dgate and dup from dout.
cudaError_t SwiGluForward(DType t, const void* gate, const void* up, void* out, int64_t n, cudaStream_t stream);
cudaError_t SwiGluBackward(DType t, const void* dout, const void* gate, const void* up, void* dgate, void* dup,
                           int64_t n, cudaStream_t stream);

// Cross-entropy over a vocabulary walked in column chunks. logits [rows, cols] hold vocabulary ids
// [vocab_offset, vocab_offset + cols). Targets outside [0, vocab) (the ignore index -100 among them) count
// as ignored.
// Stats: merges the chunk's max and sum(exp) into run_max / run_sum [rows] and stores the target's logit in
// picked [rows] when the target falls in the chunk.
cudaError_t CrossEntropyStats(DType t, const void* logits, int64_t rows, int64_t cols, int64_t vocab_offset,
                              const int64_t* targets, int64_t vocab, float* run_max, float* run_sum, float* picked,
                              cudaStream_t stream);
// Grad (in place): logits <- T((softmax - onehot(target)) * scale) with softmax = exp(logit - lse[row]);
// ignored rows become zero.
cudaError_t CrossEntropyGrad(DType t, void* logits, int64_t rows, int64_t cols, int64_t vocab_offset,
                             const int64_t* targets, int64_t vocab, const float* lse, float scale, cudaStream_t stream);

// fp32 <-> bf16 (round to nearest even), n elements.
cudaError_t FloatToBFloat16(const float* in, void* out, int64_t n, cudaStream_t stream);
cudaError_t BFloat16ToFloat(const void* in, float* out, int64_t n, cudaStream_t stream);

// Fused AdamW over n elements in place: fp32 param, exp_avg, exp_avg_sq; the gradient in `grad_dtype`; the updated
// weight rounded to bf16 into `out_bf16` unless null. Bit-equal to the CPU body (cpu_adamw.cc).
cudaError_t AdamW(float* param, float* exp_avg, float* exp_avg_sq, DType grad_dtype, const void* grad, void* out_bf16,
                  int64_t n, const AdamWScalars& scalars, cudaStream_t stream);

// The two dynamic maps of the 8-bit moments (engine/optim/adamw_8bit.h), passed by value to the kernel (2 KiB).
struct DynamicMaps {
  float signed_map[256];    // the first moment's, [-1, 1]
  float unsigned_map[256];  // the second moment's, [0, 1]
};

// AdamW with blockwise 8-bit moments over n elements in place: fp32 param; exp_avg / exp_avg_sq [n] codes of the
// signed / unsigned map with an fp32 absmax per block of 256 (ceil(n / 256) each); the gradient in `grad_dtype`; the
// updated weight rounded to bf16 into `out_bf16` unless null. Bit-equal to CpuAdamW8bit (adamw_8bit.cc).
cudaError_t AdamW8bit(float* param, uint8_t* exp_avg, float* exp_avg_absmax, uint8_t* exp_avg_sq,
                      float* exp_avg_sq_absmax, DType grad_dtype, const void* grad, void* out_bf16, int64_t n,
                      const AdamWScalars& scalars, const DynamicMaps& maps, cudaStream_t stream);

// NF4 (engine/quant/nf4.h): out [n] (bf16 or fp32) = NF4[code] * the block's absmax, n a multiple of 64, `packed` [n /
// 2] 8-byte and `out` 16-byte aligned. The scales are either absmax fp32 [n / 64] (stats_codes null) or double
// quantised: stats_codes [n / 64] of stats_map (the signed dynamic map, 256 floats), absmax2 [ceil(n / 16384)] and
// offset. nf4_code: the 16 NF4 values. Every table is device memory. Bit-identical to the CPU routines.
cudaError_t DequantizeNf4(const uint8_t* packed, const float* absmax, const uint8_t* stats_codes, const float* absmax2,
                          float offset, const float* nf4_code, const float* stats_map, DType out_dtype, void* out,
                          int64_t n, cudaStream_t stream);
}  // namespace slide::cuda
