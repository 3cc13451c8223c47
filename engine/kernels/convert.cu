// fp32 <-> bf16 conversion (round to nearest even), four elements per thread.
#include <type_traits>

#include "engine/kernels/kernel_utils.cuh"

namespace slide::cuda {
namespace {

template <class In, class Out>
__global__ void ConvertKernel(const In* __restrict__ in, Out* __restrict__ out, int64_t n) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 4;
  if (i + 4 <= n) {
    const Pack<In, 4> p = LoadPack<In, 4>(in + i);
    Pack<Out, 4> q;
#pragma unroll
    for (int k = 0; k < 4; ++k) q.v[k] = FromFloat<Out>(ToFloat(p.v[k]));
    StorePack<Out, 4>(out + i, q);
  } else {
    for (int64_t k = i; k < n; ++k) out[k] = FromFloat<Out>(ToFloat(in[k]));
  }
}

template <class In, class Out>
cudaError_t Convert(const void* in, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Packs of four need 16-byte (fp32) and 8-byte (bf16) alignment; unaligned buffers are not expected from
  // the caching allocator but are refused rather than read misaligned.
  if ((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) % (4 * sizeof(__nv_bfloat16)) != 0 ||
      (reinterpret_cast<uintptr_t>(std::is_same_v<In, float> ? in : out) % 16) != 0)
    return cudaErrorMisalignedAddress;
  ConvertKernel<In, Out>
      <<<Blocks((n + 3) / 4, 256), 256, 0, stream>>>(static_cast<const In*>(in), static_cast<Out*>(out), n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t FloatToBFloat16(const float* in, void* out, int64_t n, cudaStream_t stream) {
  return Convert<float, __nv_bfloat16>(in, out, n, stream);
}
cudaError_t BFloat16ToFloat(const void* in, float* out, int64_t n, cudaStream_t stream) {
  return Convert<__nv_bfloat16, float>(in, out, n, stream);
}

}  // namespace slide::cuda
