// Rotary embedding, forward and its transpose, on q or k in the projection's own layout [tokens, heads, dim]
// (no transpose copy). A thread rotates V pairs (i, i + half) of one token-head, computing in fp32 and rounding
// once.
#include "engine/kernels/kernel_utils.cuh"

namespace slide::cuda {
namespace {

template <class T, int V, bool kBackward>
__global__ void RopeKernel(const T* __restrict__ x, const T* __restrict__ cos, const T* __restrict__ sin,
                           T* __restrict__ y, int64_t token_heads, int64_t seq, int64_t heads, int64_t half) {
  const int64_t groups = half / V;
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= token_heads * groups) return;
  const int64_t th = idx / groups, i = (idx % groups) * V;
  const int64_t pos = (th / heads) % seq;
  const T* xr = x + th * 2 * half;
  T* yr = y + th * 2 * half;
  const T* cr = cos + pos * 2 * half;
  const T* sr = sin + pos * 2 * half;
  const Pack<T, V> a = LoadPack<T, V>(xr + i), b = LoadPack<T, V>(xr + half + i);
  const Pack<T, V> c1 = LoadPack<T, V>(cr + i), c2 = LoadPack<T, V>(cr + half + i);
  const Pack<T, V> s1 = LoadPack<T, V>(sr + i), s2 = LoadPack<T, V>(sr + half + i);
  Pack<T, V> lo, hi;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float fa = ToFloat(a.v[k]), fb = ToFloat(b.v[k]);
    if (kBackward) {  // dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1
      lo.v[k] = FromFloat<T>(fa * ToFloat(c1.v[k]) + fb * ToFloat(s2.v[k]));
      hi.v[k] = FromFloat<T>(fb * ToFloat(c2.v[k]) - fa * ToFloat(s1.v[k]));
    } else {  // y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2
      lo.v[k] = FromFloat<T>(fa * ToFloat(c1.v[k]) - fb * ToFloat(s1.v[k]));
      hi.v[k] = FromFloat<T>(fb * ToFloat(c2.v[k]) + fa * ToFloat(s2.v[k]));
    }
  }
  StorePack<T, V>(yr + i, lo);
  StorePack<T, V>(yr + half + i, hi);
}

template <class T, int V>
cudaError_t LaunchRope(const T* x, const T* cos, const T* sin, T* y, int64_t token_heads, int64_t seq, int64_t heads,
                       int64_t half, bool backward, cudaStream_t stream) {
  const int64_t threads = token_heads * (half / V);
  if (backward) {
    RopeKernel<T, V, true><<<Blocks(threads, 256), 256, 0, stream>>>(x, cos, sin, y, token_heads, seq, heads, half);
  } else {
    RopeKernel<T, V, false><<<Blocks(threads, 256), 256, 0, stream>>>(x, cos, sin, y, token_heads, seq, heads, half);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t Rope(DType t, const void* x, const void* cos, const void* sin, void* y, int64_t tokens, int64_t seq,
                 int64_t heads, int64_t dim, bool backward, cudaStream_t stream) {
  if (tokens == 0 || heads == 0 || dim == 0) return cudaSuccess;
  if (dim % 2 != 0 || seq <= 0) return cudaErrorInvalidValue;
  const int64_t half = dim / 2, token_heads = tokens * heads;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const T *xt = static_cast<const T*>(x), *ct = static_cast<const T*>(cos), *st = static_cast<const T*>(sin);
    T* yt = static_cast<T*>(y);
    constexpr int V = kPack<T>;
    const bool vec = half % V == 0 && Aligned16(x) && Aligned16(y) && Aligned16(cos) && Aligned16(sin);
    return vec ? LaunchRope<T, V>(xt, ct, st, yt, token_heads, seq, heads, half, backward, stream)
               : LaunchRope<T, 1>(xt, ct, st, yt, token_heads, seq, heads, half, backward, stream);
  });
}

}  // namespace slide::cuda
