// SwiGLU: out = silu(gate) * up and its backward, elementwise in fp32 with one rounding per output.
#include "engine/kernels/kernel_utils.cuh"

namespace slide::cuda {
namespace {

__device__ __forceinline__ float Sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

template <class T, int V>
__global__ void SwiGluForwardKernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                    int64_t packs) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= packs) return;
  const Pack<T, V> g = LoadPack<T, V>(gate + p * V), u = LoadPack<T, V>(up + p * V);
  Pack<T, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float fg = ToFloat(g.v[k]);
    o.v[k] = FromFloat<T>(fg * Sigmoid(fg) * ToFloat(u.v[k]));
  }
  StorePack<T, V>(out + p * V, o);
}

template <class T, int V>
__global__ void SwiGluBackwardKernel(const T* __restrict__ dout, const T* __restrict__ gate, const T* __restrict__ up,
                                     T* __restrict__ dgate, T* __restrict__ dup, int64_t packs) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= packs) return;
  const Pack<T, V> d = LoadPack<T, V>(dout + p * V), g = LoadPack<T, V>(gate + p * V), u = LoadPack<T, V>(up + p * V);
  Pack<T, V> dg, du;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float fg = ToFloat(g.v[k]), fd = ToFloat(d.v[k]), s = Sigmoid(fg);
    dg.v[k] = FromFloat<T>(fd * ToFloat(u.v[k]) * s * (1.f + fg * (1.f - s)));
    du.v[k] = FromFloat<T>(fd * fg * s);
  }
  StorePack<T, V>(dgate + p * V, dg);
  StorePack<T, V>(dup + p * V, du);
}

}  // namespace

cudaError_t SwiGluForward(DType t, const void* gate, const void* up, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto g = static_cast<const T*>(gate);
    auto u = static_cast<const T*>(up);
    auto o = static_cast<T*>(out);
    if (PackAligned<T>(n, {gate, up, out})) {
      const int64_t packs = n / kPack<T>;
      SwiGluForwardKernel<T, kPack<T>><<<Blocks(packs, 256), 256, 0, stream>>>(g, u, o, packs);
    } else {
      SwiGluForwardKernel<T, 1><<<Blocks(n, 256), 256, 0, stream>>>(g, u, o, n);
    }
    return cudaGetLastError();
  });
}

cudaError_t SwiGluBackward(DType t, const void* dout, const void* gate, const void* up, void* dgate, void* dup,
                           int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    auto d = static_cast<const T*>(dout);
    auto g = static_cast<const T*>(gate);
    auto u = static_cast<const T*>(up);
    auto dg = static_cast<T*>(dgate);
    auto du = static_cast<T*>(dup);
    if (PackAligned<T>(n, {dout, gate, up, dgate, dup})) {
      const int64_t packs = n / kPack<T>;
      SwiGluBackwardKernel<T, kPack<T>><<<Blocks(packs, 256), 256, 0, stream>>>(d, g, u, dg, du, packs);
    } else {
      SwiGluBackwardKernel<T, 1><<<Blocks(n, 256), 256, 0, stream>>>(d, g, u, dg, du, n);
    }
    return cudaGetLastError();
  });
}

}  // namespace slide::cuda
