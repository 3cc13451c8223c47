// Fused AdamW on the device, for the units whose optimizer state lives there. Each element is updated with the
// operations of the CPU body's scalar path (cpu_adamw.cc) in the same order, every one rounded on its own
// (__f*_rn: no contraction into FMA), so the two agree bit for bit; the bf16 weight is rounded to nearest even
// with NaN written as 0x7FC0, as the CPU does.
#include <algorithm>

#include "engine/kernels/kernel_utils.cuh"

namespace slide::cuda {
namespace {

template <class G>
__global__ void AdamWKernel(float* __restrict__ param, float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                            const G* __restrict__ grad, uint16_t* __restrict__ out_bf16, int64_t n, AdamWScalars c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    float m = exp_avg[i], v = exp_avg_sq[i];
    const float p = AdamWElement(ToFloat(grad[i]), param[i], m, v, c);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (out_bf16 != nullptr) out_bf16[i] = Bf16BitsNearestEven(p);
  }
}

}  // namespace

cudaError_t AdamW(float* param, float* exp_avg, float* exp_avg_sq, DType grad_dtype, const void* grad, void* out_bf16,
                  int64_t n, const AdamWScalars& scalars, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // A grid-stride loop over at most a few waves: the update is bound by memory, not by the launch shape.
  const int64_t blocks = std::min<int64_t>(Blocks(n, 256), 132 * 16);
  auto out = static_cast<uint16_t*>(out_bf16);
  if (grad_dtype == DType::kFloat) {
    AdamWKernel<float>
        <<<blocks, 256, 0, stream>>>(param, exp_avg, exp_avg_sq, static_cast<const float*>(grad), out, n, scalars);
  } else {
    AdamWKernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(param, exp_avg, exp_avg_sq,
                                                           static_cast<const __nv_bfloat16*>(grad), out, n, scalars);
  }
  return cudaGetLastError();
}

}  // namespace slide::cuda
