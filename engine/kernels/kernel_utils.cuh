// Device helpers shared by the kernels: fp32 <-> element conversion, 16-byte vector packs, block reductions, the
// AdamW element step, and the dtype dispatch of the launchers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "engine/kernels/cuda_launchers.h"

namespace slide::cuda {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
// The value after a round trip through T (what storing an intermediate in T would keep).
template <class T>
__device__ __forceinline__ float RoundTo(float v) {
  return ToFloat(FromFloat<T>(v));
}

// N elements of T loaded or stored as one access (16 bytes when N * sizeof(T) == 16).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};
template <class T, int N>
__device__ __forceinline__ Pack<T, N> LoadPack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <class T, int N>
__device__ __forceinline__ void StorePack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// A warp's / a block's reduction by `op` (commutative); every thread gets the result. `identity` fills the lanes of
// warps the block lacks. `scratch` holds 32 floats; all threads must call.
template <class Op>
__device__ __forceinline__ float WarpReduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <class Op>
__device__ __forceinline__ float BlockReduce(float v, float* scratch, float identity, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = WarpReduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? scratch[threadIdx.x] : identity;
  if (warp == 0) v = WarpReduce(v, op);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  const float result = scratch[0];
  __syncthreads();  // scratch may be reused right after
  return result;
}
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {  // fmaxf skips a NaN, as std::max(acc, x) does on the CPU
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
__device__ __forceinline__ float WarpSum(float v) { return WarpReduce(v, AddOp{}); }
__device__ __forceinline__ float BlockSum(float v, float* scratch) { return BlockReduce(v, scratch, 0.f, AddOp{}); }
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  return BlockReduce(v, scratch, -INFINITY, MaxOp{});
}

// bf16 bits of f rounded to nearest even, NaN written as 0x7FC0: what the CPU's AdamW bodies write.
__device__ __forceinline__ uint16_t Bf16BitsNearestEven(float f) {
  if (isnan(f)) return 0x7FC0;
  uint32_t bits = __float_as_uint(f);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// One element's AdamW step with the CPU body's operations in its order (cpu_adamw.cc's scalar path), each rounded on
// its own (__f*_rn: no contraction into FMA), so device and host agree bit for bit. g is the gradient before
// grad_scale; m and v are updated in place; returns the new weight. Both AdamW kernels (fp32 and 8-bit moments) use it.
__device__ __forceinline__ float AdamWElement(float g, float param, float& m, float& v, const AdamWScalars& c) {
  g = __fmul_rn(g, c.grad_scale);
  const float p = __fmul_rn(param, c.decay);
  m = __fadd_rn(m, __fmul_rn(c.one_minus_b1, __fsub_rn(g, m)));
  v = __fadd_rn(__fmul_rn(v, c.b2), __fmul_rn(c.one_minus_b2, __fmul_rn(g, g)));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  return __fsub_rn(p, __fmul_rn(c.step_size, __fdiv_rn(m, denom)));
}

// Elements per 16-byte pack, and whether every row of `cols` elements starting at the given pointers is
// aligned for packs.
template <class T>
constexpr int kPack = 16 / sizeof(T);
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// Whether rows of `n` elements at each pointer can be walked in 16-byte packs.
template <class T>
bool PackAligned(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % kPack<T> != 0) return false;
  for (const void* p : ptrs)
    if (!Aligned16(p)) return false;
  return true;
}

// Calls fn(T{}) with T the element type of `t`.
template <class Fn>
cudaError_t Dispatch(DType t, Fn&& fn) {
  if (t == DType::kFloat) return fn(float{});
  return fn(__nv_bfloat16{});
}

inline int Blocks(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

}  // namespace slide::cuda
