// NF4 dequantisation (QLoRA's frozen base): packed 4-bit codes and their block scales into bf16 (or fp32) weights, at
// memory speed. Each thread turns 8 packed bytes (16 elements, all in one 64-element block) into 16 outputs stored
// as 16-byte packs.
// With double quantisation the block's absmax is expanded in the same thread (map[code] * absmax2, then + offset,
// each rounded: no fused multiply-add), so the result is bit-identical to engine/quant/nf4.cc's CPU routines.
#include "engine/kernels/kernel_utils.cuh"

namespace slide::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kElementsPerThread = 16;
constexpr int64_t kBlock = 64;        // elements per absmax
constexpr int64_t kStatsBlock = 256;  // absmax values per absmax2

template <class Out>
__global__ void DequantizeNf4Kernel(const uint8_t* __restrict__ packed, const float* __restrict__ absmax,
                                    const uint8_t* __restrict__ stats_codes, const float* __restrict__ absmax2,
                                    float offset, const float* __restrict__ nf4_code,
                                    const float* __restrict__ stats_map, Out* __restrict__ out, int64_t n) {
  __shared__ float code[16];
  __shared__ float map[256];
  if (threadIdx.x < 16) code[threadIdx.x] = nf4_code[threadIdx.x];
  if (stats_codes != nullptr)
    for (int i = threadIdx.x; i < 256; i += blockDim.x) map[i] = stats_map[i];
  __syncthreads();
  const int64_t first = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kElementsPerThread;
  if (first >= n) return;
  const int64_t block = first / kBlock;
  float scale;
  if (stats_codes != nullptr)
    scale = __fadd_rn(__fmul_rn(map[stats_codes[block]], absmax2[block / kStatsBlock]), offset);
  else
    scale = absmax[block];
  const Pack<uint8_t, 8> bytes = LoadPack<uint8_t, 8>(packed + first / 2);
  constexpr int kPer = kPack<Out>;  // outputs per 16-byte store
  Pack<Out, kPer> part;
#pragma unroll
  for (int k = 0; k < kElementsPerThread; ++k) {
    const uint8_t b = bytes.v[k / 2];
    part.v[k % kPer] = FromFloat<Out>(__fmul_rn(code[k % 2 == 0 ? b >> 4 : b & 0xF], scale));
    if (k % kPer == kPer - 1) StorePack<Out, kPer>(out + first + k - (kPer - 1), part);
  }
}

}  // namespace

cudaError_t DequantizeNf4(const uint8_t* packed, const float* absmax, const uint8_t* stats_codes, const float* absmax2,
                          float offset, const float* nf4_code, const float* stats_map, DType out_dtype, void* out,
                          int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n % kBlock != 0) return cudaErrorInvalidValue;
  if ((stats_codes == nullptr) == (absmax == nullptr)) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(packed) % 8) != 0 || !Aligned16(out)) return cudaErrorMisalignedAddress;
  const int blocks = Blocks(n / kElementsPerThread, kThreads);
  if (out_dtype == DType::kBFloat16)
    DequantizeNf4Kernel<<<blocks, kThreads, 0, stream>>>(packed, absmax, stats_codes, absmax2, offset, nf4_code,
                                                         stats_map, static_cast<__nv_bfloat16*>(out), n);
  else
    DequantizeNf4Kernel<<<blocks, kThreads, 0, stream>>>(packed, absmax, stats_codes, absmax2, offset, nf4_code,
                                                         stats_map, static_cast<float*>(out), n);
  return cudaGetLastError();
}

}  // namespace slide::cuda
