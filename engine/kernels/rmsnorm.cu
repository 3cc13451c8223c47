// RMSNorm forward and backward. Forward: one block per row. Backward: a block walks a stripe of rows and keeps
// its share of the weight gradient in fp32 (registers, with the row itself held between the two passes, for rows
// up to 4 packs per thread; shared memory, one float per column, beyond), and a second kernel sums the stripes.
// The forward rounds the normalised row to T before the weight multiply, as the unfused reference does.
#include <algorithm>
#include <climits>

#include "engine/kernels/kernel_utils.cuh"

namespace slide::cuda {
namespace {

int RowThreads(int64_t cols, int vec) {
  const int64_t packs = (cols + vec - 1) / vec;
  int threads = 32;
  while (threads < 256 && threads < packs) threads *= 2;
  return threads;
}

template <class T, int V>
__global__ void RmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                     float* __restrict__ rstd, int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float ss = 0.f;
  for (int64_t c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    const Pack<T, V> p = LoadPack<T, V>(xr + c);
#pragma unroll
    for (int i = 0; i < V; ++i) ss += ToFloat(p.v[i]) * ToFloat(p.v[i]);
  }
  const float r = rsqrtf(BlockSum(ss, scratch) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
    const Pack<T, V> px = LoadPack<T, V>(xr + c), pw = LoadPack<T, V>(w + c);
    Pack<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = FromFloat<T>(RoundTo<T>(ToFloat(px.v[i]) * r) * ToFloat(pw.v[i]));
    StorePack<T, V>(yr + c, out);
  }
}

// Sum over the block with one barrier: every thread adds the warps' sums itself. `scratch` (32 floats) may be
// reused only after the next call's barrier, so callers alternate between two.
__device__ __forceinline__ float BlockSumOneBarrier(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

// The backward for rows of at most P packs per thread: the row (dy, x) stays in registers between the two
// passes, the next row's loads (its rstd included: a load at the top of each row would put a memory latency on
// every row's critical path) are issued before this row's block-wide reduction, so the reduction's latency is
// hidden behind memory, and the thread's share of the weight gradient accumulates in registers.
// Measured slower at 8192 x 4096 on the H200 (68.0-68.3% of copy as it is): bounding it to 3 blocks per SM (80
// registers, a small spill) 59.4%; staging the rows in shared memory with cp.async (66 registers, two rows in flight
// per block) 63.1%; capping it at 64 registers (__launch_bounds__(1024)) 47%.
template <class T, int V, int P>
__global__ void RmsNormBackwardRegistersKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                               const T* __restrict__ w, const float* __restrict__ rstd,
                                               T* __restrict__ dx, float* __restrict__ partial, int64_t rows,
                                               int64_t cols) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // the partial sum may launch now; it still waits for these writes
#endif
  __shared__ float scratch[2][32];  // alternate rows use alternate halves (one barrier per row)
  int parity = 0;
  float dw_acc[P][V];
  Pack<T, V> pw[P], pdy[P], px[P], ndy[P], nx[P];
  auto column = [&](int k) { return (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * V; };
  auto load_row = [&](int64_t row, Pack<T, V>* dys, Pack<T, V>* xs, float* r) {
    *r = rstd[row];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (column(k) >= cols) continue;
      dys[k] = LoadPack<T, V>(dy + row * cols + column(k));
      xs[k] = LoadPack<T, V>(x + row * cols + column(k));
    }
  };
#pragma unroll
  for (int k = 0; k < P; ++k) {
#pragma unroll
    for (int i = 0; i < V; ++i) dw_acc[k][i] = 0.f;
    if (column(k) < cols) pw[k] = LoadPack<T, V>(w + column(k));
  }
  float r = 0.f, next_r = 0.f;
  if (blockIdx.x < rows) load_row(blockIdx.x, pdy, px, &r);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float dot = 0.f;  // sum(dn * n)
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (column(k) >= cols) continue;
#pragma unroll
      for (int i = 0; i < V; ++i)
        dot += RoundTo<T>(ToFloat(pdy[k].v[i]) * ToFloat(pw[k].v[i])) * ToFloat(px[k].v[i]) * r;
    }
    if (row + gridDim.x < rows) load_row(row + gridDim.x, ndy, nx, &next_r);
    const float mean = BlockSumOneBarrier(dot, scratch[parity]) / static_cast<float>(cols);
    parity ^= 1;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (column(k) >= cols) continue;
      Pack<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float n = ToFloat(px[k].v[i]) * r;
        const float dn = RoundTo<T>(ToFloat(pdy[k].v[i]) * ToFloat(pw[k].v[i]));
        out.v[i] = FromFloat<T>(r * (dn - n * mean));
        dw_acc[k][i] += ToFloat(pdy[k].v[i]) * RoundTo<T>(n);
      }
      StorePack<T, V>(dx + row * cols + column(k), out);
      pdy[k] = ndy[k];
      px[k] = nx[k];
    }
    r = next_r;
  }
#pragma unroll
  for (int k = 0; k < P; ++k) {
    if (column(k) >= cols) continue;
#pragma unroll
    for (int i = 0; i < V; ++i) partial[blockIdx.x * cols + column(k) + i] = dw_acc[k][i];
  }
}

template <class T, int V>
__global__ void RmsNormBackwardKernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                      const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ partial,
                                      int64_t rows, int64_t cols) {
  extern __shared__ float dw_acc[];  // [cols]: each thread touches only the columns it owns
  __shared__ float scratch[32];
  for (int64_t c = threadIdx.x * V; c < cols; c += blockDim.x * V)
#pragma unroll
    for (int i = 0; i < V; ++i) dw_acc[c + i] = 0.f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * cols;
    const T* xr = x + row * cols;
    const float r = rstd[row];
    float dot = 0.f;  // sum(dn * n)
    for (int64_t c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
      const Pack<T, V> pdy = LoadPack<T, V>(dyr + c), px = LoadPack<T, V>(xr + c), pw = LoadPack<T, V>(w + c);
#pragma unroll
      for (int i = 0; i < V; ++i) dot += RoundTo<T>(ToFloat(pdy.v[i]) * ToFloat(pw.v[i])) * ToFloat(px.v[i]) * r;
    }
    const float mean = BlockSum(dot, scratch) / static_cast<float>(cols);
    for (int64_t c = threadIdx.x * V; c < cols; c += blockDim.x * V) {
      const Pack<T, V> pdy = LoadPack<T, V>(dyr + c), px = LoadPack<T, V>(xr + c), pw = LoadPack<T, V>(w + c);
      Pack<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float n = ToFloat(px.v[i]) * r;
        const float dn = RoundTo<T>(ToFloat(pdy.v[i]) * ToFloat(pw.v[i]));
        out.v[i] = FromFloat<T>(r * (dn - n * mean));
        dw_acc[c + i] += ToFloat(pdy.v[i]) * RoundTo<T>(n);
      }
      StorePack<T, V>(dx + row * cols + c, out);
    }
  }
  for (int64_t c = threadIdx.x * V; c < cols; c += blockDim.x * V)
#pragma unroll
    for (int i = 0; i < V; ++i) partial[blockIdx.x * cols + c + i] = dw_acc[c + i];
}

// dw[c] = sum over parts: a block takes 32 columns and its 32 rows of threads split the parts between them, each
// keeping eight loads in flight (a summing loop with one load per add waits a full memory latency per part; at
// 264 parts eight per round is one round and a tail).
template <class T>
__global__ void SumPartialsKernel(const float* __restrict__ partial, int parts, int64_t cols, T* __restrict__ dw) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();  // a no-op unless launched as a programmatic dependent
#endif
  __shared__ float sums[32][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float s[8] = {};
  if (c < cols) {
    int p = threadIdx.y;
    for (; p + 7 * 32 < parts; p += 8 * 32) {
#pragma unroll
      for (int k = 0; k < 8; ++k) s[k] += partial[(p + k * 32) * cols + c];
    }
    for (; p < parts; p += 32) s[0] += partial[p * cols + c];
  }
  sums[threadIdx.y][threadIdx.x] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < 32; ++y) total += sums[y][threadIdx.x];
    dw[c] = FromFloat<T>(total);
  }
}

}  // namespace

cudaError_t RmsNormForward(DType t, const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols,
                           float eps, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (rows > INT_MAX) return cudaErrorInvalidValue;  // one block per row
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(w);
    T* yt = static_cast<T*>(y);
    if (PackAligned<T>(cols, {x, w, y})) {
      RmsNormForwardKernel<T, kPack<T>><<<rows, RowThreads(cols, kPack<T>), 0, stream>>>(xt, wt, yt, rstd, cols, eps);
    } else {
      RmsNormForwardKernel<T, 1><<<rows, RowThreads(cols, 1), 0, stream>>>(xt, wt, yt, rstd, cols, eps);
    }
    return cudaGetLastError();
  });
}

int RmsNormPartialRows(int64_t rows) {
  int sms = 132;
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // Enough blocks in flight to hide the per-row reduction's latency; each writes one row of partial sums.
  return static_cast<int>(rows < 4 * sms ? (rows > 0 ? rows : 1) : 4 * sms);
}

cudaError_t RmsNormBackward(DType t, const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                            void* dw, float* partial, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  int parts = RmsNormPartialRows(rows);  // the most stripes; fewer when fewer blocks fit on the device at once
  const size_t shared = static_cast<size_t>(cols) * sizeof(float);
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kPack<T>;
    const bool packs = PackAligned<T>(cols, {dy, x, w, dx});
    const int threads = RowThreads(cols, packs ? V : 1);
    const int64_t per_thread = packs ? (cols / V + threads - 1) / threads : 0;
    if (rows == 0) {
      cudaMemsetAsync(partial, 0, static_cast<size_t>(parts) * shared, stream);
    } else if (packs && per_thread <= 4) {
      auto* kernel = per_thread <= 1   ? RmsNormBackwardRegistersKernel<T, V, 1>
                     : per_thread <= 2 ? RmsNormBackwardRegistersKernel<T, V, 2>
                                       : RmsNormBackwardRegistersKernel<T, V, 4>;
      // One wave: as many stripes as blocks fit at once (a second, partial wave would idle most SMs).
      int per_sm = 0, device = 0, sms = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) == cudaSuccess &&
          cudaGetDevice(&device) == cudaSuccess &&
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && per_sm > 0)
        parts = std::min(parts, per_sm * sms);
      kernel<<<parts, threads, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                            static_cast<const T*>(w), rstd, static_cast<T*>(dx), partial, rows, cols);
    } else {
      auto* kernel = packs ? RmsNormBackwardKernel<T, V> : RmsNormBackwardKernel<T, 1>;
      // The weight-gradient share lives in dynamic shared memory: past 32 KiB (with the static scratch) the
      // kernel must opt in to more than the default 48 KiB.
      // The opt-in is set to the device's maximum, the same value on every call (no race between callers with
      // different widths); a row wider than that is refused.
      if (shared > 32 * 1024) {
        int device = 0, optin = 0;
        if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
        if (const cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
            e != cudaSuccess)
          return e;
        if (shared + 32 * sizeof(float) > static_cast<size_t>(optin)) return cudaErrorInvalidValue;
        if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       optin - static_cast<int>(32 * sizeof(float)));
            e != cudaSuccess)
          return e;
      }
      kernel<<<parts, threads, shared, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                 static_cast<const T*>(w), rstd, static_cast<T*>(dx), partial, rows,
                                                 cols);
    }
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    // On sm_90 the sum is launched as a programmatic dependent of the stripes: its launch overlaps their tail and
    // its blocks wait in cudaGridDependencySynchronize for the stripes' writes, instead of behind a full kernel
    // boundary (8192 x 4096 on the H200: 68.3% of copy with a plain launch, 69.5% with this, 72% with no sum).
    int device = 0, major = 0;
    const bool dependent = cudaGetDevice(&device) == cudaSuccess &&
                           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                           major >= 9;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(Blocks(cols, 32)));
    config.blockDim = dim3(32, 32);
    config.stream = stream;
    cudaLaunchAttribute overlap{};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &overlap;
    config.numAttrs = dependent ? 1 : 0;
    return cudaLaunchKernelEx(&config, SumPartialsKernel<T>, static_cast<const float*>(partial), parts, cols,
                              static_cast<T*>(dw));
  });
}

}  // namespace slide::cuda
