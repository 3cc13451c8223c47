// AdamW with blockwise 8-bit moments on the device (a job's `optimizer: adamw_8bit` for units whose state lives
// there), bit-equal to the CPU's CpuAdamW8bit (engine/optim/adamw_8bit.cc). One thread block of 256 threads takes one
// quantisation block of 256 elements, one element a thread: it dequantises the two moments through the dynamic maps
// (held in shared memory), runs AdamWElement (kernel_utils.cuh: the CPU's operations in its order, each rounded on
// its own), takes each moment's new absmax over the block (a max: exact in any order) and requantises every moment to
// the nearest code by NearestCode's rule (a lower_bound over the sorted map, an exact midpoint to the lower code, a NaN
// to code 0), so codes, absmax, master and bf16 weight all equal the CPU's.
#include <algorithm>

#include "engine/kernels/kernel_utils.cuh"

namespace slide::cuda {
namespace {

constexpr int kBlock = 256;  // elements per absmax (kQuantBlock) and threads per block

// NearestCode of adamw_8bit.cc: x clamped to [-1, 1] (a NaN stays NaN), then std::lower_bound's answer found by the
// same comparisons (map[i] < x), then the nearer neighbour with ties to the lower code.
__device__ __forceinline__ uint8_t NearestCode(const float* map, float x) {
  x = x < -1.0f ? -1.0f : (1.0f < x ? 1.0f : x);
  int lo = 0, count = 256;  // lower_bound: the first i with !(map[i] < x)
  while (count > 0) {
    const int step = count / 2;
    if (map[lo + step] < x) {
      lo += step + 1;
      count -= step + 1;
    } else {
      count = step;
    }
  }
  if (lo == 0) return 0;
  if (lo == 256) return 255;
  return __fsub_rn(map[lo], x) < __fsub_rn(x, map[lo - 1]) ? static_cast<uint8_t>(lo) : static_cast<uint8_t>(lo - 1);
}

template <class G>
__global__ void __launch_bounds__(kBlock)
    AdamW8bitKernel(float* __restrict__ param, uint8_t* __restrict__ exp_avg, float* __restrict__ exp_avg_absmax,
                    uint8_t* __restrict__ exp_avg_sq, float* __restrict__ exp_avg_sq_absmax, const G* __restrict__ grad,
                    uint16_t* __restrict__ out_bf16, int64_t n, AdamWScalars c, DynamicMaps maps) {
  __shared__ float map1[256], map2[256], scratch[32];
  map1[threadIdx.x] = maps.signed_map[threadIdx.x];
  map2[threadIdx.x] = maps.unsigned_map[threadIdx.x];
  __syncthreads();
  const int64_t b = blockIdx.x, i = b * kBlock + threadIdx.x;
  const bool in = i < n;
  float m = 0.0f, v = 0.0f;
  if (in) {
    m = __fmul_rn(map1[exp_avg[i]], exp_avg_absmax[b]);
    v = __fmul_rn(map2[exp_avg_sq[i]], exp_avg_sq_absmax[b]);
    const float p = AdamWElement(ToFloat(grad[i]), param[i], m, v, c);
    param[i] = p;
    if (out_bf16 != nullptr) out_bf16[i] = Bf16BitsNearestEven(p);
  }
  // Every thread reaches the reductions (they synchronise the block); only those inside the parameter store. The
  // CPU's absmax starts at 0 and skips NaN: a thread past the parameter's end passes 0, and a block of NaN moments
  // (BlockMax's NaN or -inf) gives 0 as well.
  const float amax1 = fmaxf(0.0f, BlockMax(in ? fabsf(m) : 0.0f, scratch));
  const float amax2 = fmaxf(0.0f, BlockMax(in ? fabsf(v) : 0.0f, scratch));
  if (threadIdx.x == 0) {
    exp_avg_absmax[b] = amax1;
    exp_avg_sq_absmax[b] = amax2;
  }
  if (!in) return;
  exp_avg[i] = amax1 == 0.0f ? 0 : NearestCode(map1, __fmul_rn(m, __fdiv_rn(1.0f, amax1)));
  exp_avg_sq[i] = amax2 == 0.0f ? 0 : NearestCode(map2, __fmul_rn(v, __fdiv_rn(1.0f, amax2)));
}

}  // namespace

cudaError_t AdamW8bit(float* param, uint8_t* exp_avg, float* exp_avg_absmax, uint8_t* exp_avg_sq,
                      float* exp_avg_sq_absmax, DType grad_dtype, const void* grad, void* out_bf16, int64_t n,
                      const AdamWScalars& scalars, const DynamicMaps& maps, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = Blocks(n, kBlock);
  auto out = static_cast<uint16_t*>(out_bf16);
  if (grad_dtype == DType::kFloat) {
    AdamW8bitKernel<float><<<blocks, kBlock, 0, stream>>>(param, exp_avg, exp_avg_absmax, exp_avg_sq, exp_avg_sq_absmax,
                                                          static_cast<const float*>(grad), out, n, scalars, maps);
  } else {
    AdamW8bitKernel<__nv_bfloat16>
        <<<blocks, kBlock, 0, stream>>>(param, exp_avg, exp_avg_absmax, exp_avg_sq, exp_avg_sq_absmax,
                                        static_cast<const __nv_bfloat16*>(grad), out, n, scalars, maps);
  }
  return cudaGetLastError();
}

}  // namespace slide::cuda
