// Cross-entropy over a vocabulary chunk of logits [rows, cols]: the stats pass folds the chunk into each row's
// running max and sum(exp) (online softmax), the grad pass turns the chunk into d(loss)/d(logits) in place.
// One block per row; logits are read in 16-byte packs; all arithmetic is fp32, with the exponentials taken in
// base 2 on logits pre-scaled by log2(e) (one MUFU.EX2 per element instead of expf's longer sequence; the
// kernel is otherwise bound by arithmetic, not memory). run_max is kept in natural units.
#include <climits>
#include <cmath>

#include "engine/kernels/kernel_utils.cuh"

namespace slide::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct MaxSum {
  float m;  // running max of x * log2(e)
  float s;  // sum of 2^(x * log2(e) - m) = sum of exp(x - max)
};

__device__ __forceinline__ MaxSum Merge(MaxSum a, MaxSum b) {
  if (isnan(a.s) || isnan(b.s)) return {fmaxf(a.m, b.m), NAN};  // a NaN logit makes the row's loss NaN
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * exp2f(a.m - m) + b.s * exp2f(b.m - m)};
}

__device__ __forceinline__ MaxSum BlockMerge(MaxSum v, MaxSum* scratch) {
  for (int o = 16; o > 0; o >>= 1)
    v = Merge(v, MaxSum{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : MaxSum{-INFINITY, 0.f};
    for (int o = 16; o > 0; o >>= 1)
      v = Merge(v, MaxSum{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  }
  return v;  // valid in thread 0
}

template <class T, int V>
__global__ void StatsKernel(const T* __restrict__ logits, int64_t cols, int64_t vocab_offset,
                            const int64_t* __restrict__ targets, int64_t vocab, float* __restrict__ run_max,
                            float* __restrict__ run_sum, float* __restrict__ picked) {
  __shared__ MaxSum scratch[32];
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * cols;
  MaxSum acc{-INFINITY, 0.f};
  auto fold = [&](const Pack<T, V>& p) {
    float v2[V];
    float pm = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v2[k] = ToFloat(p.v[k]) * kLog2e;
      pm = fmaxf(pm, v2[k]);  // fmaxf drops NaN: tracked on the side
      nan |= isnan(v2[k]);
    }
    if (nan) acc.s = NAN;
    if (pm > acc.m) {
      acc.s *= exp2f(acc.m - pm);
      acc.m = pm;
    }
    if (acc.m == -INFINITY) return;
#pragma unroll
    for (int k = 0; k < V; ++k) acc.s += exp2f(v2[k] - acc.m);
  };
  // Two packs per thread per iteration, both loaded before either is folded in: twice the bytes in flight.
  const int64_t stride = static_cast<int64_t>(blockDim.x) * V;
  for (int64_t c = threadIdx.x * V; c < cols; c += 2 * stride) {
    const bool second = c + stride < cols;
    const Pack<T, V> p0 = LoadPack<T, V>(lr + c);
    Pack<T, V> p1;
    if (second) p1 = LoadPack<T, V>(lr + c + stride);
    fold(p0);
    if (second) fold(p1);
  }
  acc = BlockMerge(acc, scratch);
  if (threadIdx.x == 0) {
    const MaxSum merged = Merge(MaxSum{run_max[row] * kLog2e, run_sum[row]}, acc);
    run_max[row] = merged.m * kLn2;
    run_sum[row] = merged.s;
    const int64_t t = targets[row];
    if (t >= 0 && t < vocab && t >= vocab_offset && t < vocab_offset + cols)
      picked[row] = ToFloat(lr[t - vocab_offset]);
  }
}

template <class T, int V>
__global__ void GradKernel(T* __restrict__ logits, int64_t cols, int64_t vocab_offset,
                           const int64_t* __restrict__ targets, int64_t vocab, const float* __restrict__ lse,
                           float scale) {
  const int64_t row = blockIdx.x;
  T* lr = logits + row * cols;
  const int64_t t = targets[row];
  const float row_scale = (t >= 0 && t < vocab) ? scale : 0.f;
  const int64_t local_target = t - vocab_offset;
  const float l2 = lse[row] * kLog2e;
  auto grad = [&](Pack<T, V>& p, int64_t c) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float g = exp2f(ToFloat(p.v[k]) * kLog2e - l2) * row_scale;
      if (c + k == local_target) g -= row_scale;
      p.v[k] = FromFloat<T>(g);
    }
  };
  // Four packs per thread per iteration, all loaded before any is written: more bytes in flight per warp.
  constexpr int kUnroll = 4;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * V;
  for (int64_t c0 = threadIdx.x * V; c0 < cols; c0 += kUnroll * stride) {
    Pack<T, V> p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * stride < cols) p[u] = LoadPack<T, V>(lr + c0 + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + u * stride >= cols) continue;
      grad(p[u], c0 + u * stride);
      StorePack<T, V>(lr + c0 + u * stride, p[u]);
    }
  }
}

}  // namespace

cudaError_t CrossEntropyStats(DType t, const void* logits, int64_t rows, int64_t cols, int64_t vocab_offset,
                              const int64_t* targets, int64_t vocab, float* run_max, float* run_sum, float* picked,
                              cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (rows > INT_MAX) return cudaErrorInvalidValue;  // one block per row
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const T* l = static_cast<const T*>(logits);
    if (PackAligned<T>(cols, {logits})) {
      StatsKernel<T, kPack<T>>
          <<<rows, kThreads, 0, stream>>>(l, cols, vocab_offset, targets, vocab, run_max, run_sum, picked);
    } else {
      StatsKernel<T, 1><<<rows, kThreads, 0, stream>>>(l, cols, vocab_offset, targets, vocab, run_max, run_sum, picked);
    }
    return cudaGetLastError();
  });
}

cudaError_t CrossEntropyGrad(DType t, void* logits, int64_t rows, int64_t cols, int64_t vocab_offset,
                             const int64_t* targets, int64_t vocab, const float* lse, float scale,
                             cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (rows > INT_MAX) return cudaErrorInvalidValue;  // one block per row
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    T* l = static_cast<T*>(logits);
    if (PackAligned<T>(cols, {logits})) {
      GradKernel<T, kPack<T>><<<rows, kThreads, 0, stream>>>(l, cols, vocab_offset, targets, vocab, lse, scale);
    } else {
      GradKernel<T, 1><<<rows, kThreads, 0, stream>>>(l, cols, vocab_offset, targets, vocab, lse, scale);
    }
    return cudaGetLastError();
  });
}

}  // namespace slide::cuda
