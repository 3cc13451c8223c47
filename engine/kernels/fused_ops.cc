#include "engine/kernels/fused_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <limits>

#if SLIDE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "engine/kernels/cuda_launchers.h"
#endif

namespace slide {
namespace {

std::atomic<bool> g_enabled{true};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
}

#if SLIDE_HAVE_CUDA
cuda::DType KernelDtype(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? cuda::DType::kFloat : cuda::DType::kBFloat16;
}
cudaStream_t Stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// The kernels are built for sm_80 and newer (bf16 arithmetic, 16-byte packs); older devices take the fallback.
bool DeviceSupported(c10::DeviceIndex index) {
  static std::atomic<int> supported[64] = {};  // 0 unknown, 1 yes, 2 no
  if (index < 0 || index >= 64) return false;
  int state = supported[index].load();
  if (state == 0) {
    int major = 0;
    state =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) == cudaSuccess && major >= 8 ? 1 : 2;
    supported[index].store(state);
  }
  return state == 1;
}
void Check(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "CUDA kernel ", what, " failed: ", cudaGetErrorString(e));
}

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
    const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : xc.numel() / cols;
    at::Tensor y = at::empty_like(xc);
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    Check(cuda::RmsNormForward(KernelDtype(x), xc.data_ptr(), wc.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), rows,
                               cols, static_cast<float>(eps), Stream()),
          "rmsnorm forward");
    ctx->save_for_backward({xc, wc, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor dy = grads[0].contiguous();
    const int64_t cols = x.size(-1), rows = rstd.size(0);
    at::Tensor dx = at::empty_like(x), dw = at::empty_like(w);
    at::Tensor partial = at::empty({cuda::RmsNormPartialRows(rows), cols}, x.options().dtype(at::kFloat));
    Check(cuda::RmsNormBackward(KernelDtype(x), dy.data_ptr(), x.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(),
                                dx.data_ptr(), dw.data_ptr(), partial.data_ptr<float>(), rows, cols, Stream()),
          "rmsnorm backward");
    return {dx, dw, at::Tensor()};
  }
};

at::Tensor RunRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  Check(cuda::Rope(KernelDtype(x), x.data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(), x.size(0) * x.size(1),
                   x.size(1), x.size(2), x.size(3), backward, Stream()),
        backward ? "rope backward" : "rope forward");
  return y;
}

struct RopeFn : public torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const at::Tensor c = cos.contiguous(), s = sin.contiguous();
    ctx->save_for_backward({c, s});
    return RunRope(x.contiguous(), c, s, /*backward=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {RunRope(grads[0].contiguous(), saved[0], saved[1], /*backward=*/true), at::Tensor(), at::Tensor()};
  }
};

struct SwiGluFn : public torch::autograd::Function<SwiGluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const c10::cuda::CUDAGuard guard(gate.device());
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    at::Tensor out = at::empty_like(g);
    Check(cuda::SwiGluForward(KernelDtype(g), g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), Stream()),
          "swiglu forward");
    ctx->save_for_backward({g, u});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    const c10::cuda::CUDAGuard guard(g.device());
    const at::Tensor d = grads[0].contiguous();
    at::Tensor dg = at::empty_like(g), du = at::empty_like(u);
    Check(cuda::SwiGluBackward(KernelDtype(g), d.data_ptr(), g.data_ptr(), u.data_ptr(), dg.data_ptr(), du.data_ptr(),
                               g.numel(), Stream()),
          "swiglu backward");
    return {dg, du};
  }
};
#endif  // SLIDE_HAVE_CUDA

// b can join a in a fused kernel: same dtype, same device.
bool SameDtypeAndDevice(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

// The cross-entropy row operations' arguments: logits [rows, cols]; int64 targets and fp32 [rows] state, all
// contiguous on the logits' device.
void CheckRowArguments(const at::Tensor& logits, const at::Tensor& targets,
                       std::initializer_list<const at::Tensor*> row_state) {
  TORCH_CHECK(logits.dim() == 2, "cross-entropy rows: logits must be [rows, cols]");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) && targets.scalar_type() == at::kLong &&
                  targets.is_contiguous() && targets.device() == logits.device(),
              "cross-entropy rows: targets must be contiguous int64 [rows] on the logits' device");
  for (const at::Tensor* t : row_state)
    TORCH_CHECK(t->dim() == 1 && t->size(0) == logits.size(0) && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                    t->device() == logits.device(),
                "cross-entropy rows: row state must be contiguous fp32 [rows] on the logits' device");
}

// The ATen fallback's view of a chunk's targets: each row's column in the chunk (clamped, safe to gather or
// scatter at) and whether the row's target really lies in the chunk.
struct ChunkTargets {
  at::Tensor column;    // [rows, 1] int64
  at::Tensor in_chunk;  // [rows] bool
};
ChunkTargets TargetsInChunk(const at::Tensor& targets, int64_t vocab_offset, int64_t cols, int64_t vocab) {
  const at::Tensor local = targets - vocab_offset;
  return {local.clamp(0, cols - 1).unsqueeze(1), targets.ge(0) & targets.lt(vocab) & local.ge(0) & local.lt(cols)};
}

}  // namespace

void SetFusedKernelsEnabled(bool enabled) { g_enabled.store(enabled); }

bool FusedKernelsEnabled() { return SLIDE_HAVE_CUDA && g_enabled.load(); }

bool UseFusedKernels(const at::Tensor& x) {
  if (!FusedKernelsEnabled() || !x.defined() || !x.is_cuda() ||
      (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16))
    return false;
#if SLIDE_HAVE_CUDA
  return DeviceSupported(x.device().index());
#else
  return false;
#endif
}

at::Tensor RmsNormUnfused(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor x32 = x.to(at::kFloat);
  at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
#if SLIDE_HAVE_CUDA
  if (UseFusedKernels(x) && SameDtypeAndDevice(x, weight) && weight.dim() == 1 && weight.size(0) == x.size(-1))
    return RmsNormFn::apply(x, weight, eps);
#endif
  return RmsNormUnfused(x, weight, eps);
}

at::Tensor ApplyRotaryUnfused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x [B, S, heads, D]; the tables broadcast over the heads.
  return x * cos.unsqueeze(1) + RotateHalf(x) * sin.unsqueeze(1);
}

at::Tensor ApplyRotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 2 && cos.size(0) == x.size(1) && cos.size(1) == x.size(3) &&
                  sin.sizes() == cos.sizes() && x.size(3) % 2 == 0,
              "rotary: x must be [B, S, heads, D] and the tables [S, D] with D even");
#if SLIDE_HAVE_CUDA
  if (UseFusedKernels(x) && SameDtypeAndDevice(x, cos) && SameDtypeAndDevice(x, sin)) return RopeFn::apply(x, cos, sin);
#endif
  return ApplyRotaryUnfused(x, cos, sin);
}

at::Tensor SwiGluUnfused(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up) {
#if SLIDE_HAVE_CUDA
  if (UseFusedKernels(gate) && SameDtypeAndDevice(gate, up) && gate.sizes() == up.sizes())
    return SwiGluFn::apply(gate, up);
#endif
  return SwiGluUnfused(gate, up);
}

at::Tensor ConvertDtype(const at::Tensor& x, at::ScalarType dtype) {
#if SLIDE_HAVE_CUDA
  const bool f2b = x.scalar_type() == at::kFloat && dtype == at::kBFloat16;
  const bool b2f = x.scalar_type() == at::kBFloat16 && dtype == at::kFloat;
  if (UseFusedKernels(x) && (f2b || b2f)) {
    const at::Tensor xc = x.contiguous();
    // The kernel reads and writes packs of four; a view at an unaligned offset takes Tensor::to.
    if (reinterpret_cast<uintptr_t>(xc.data_ptr()) % 16 == 0) {
      const c10::cuda::CUDAGuard guard(x.device());
      at::Tensor out = at::empty(xc.sizes(), xc.options().dtype(dtype));
      Check(f2b ? cuda::FloatToBFloat16(xc.data_ptr<float>(), out.data_ptr(), xc.numel(), Stream())
                : cuda::BFloat16ToFloat(xc.data_ptr(), out.data_ptr<float>(), xc.numel(), Stream()),
            "dtype conversion");
      return out;
    }
  }
#endif
  return x.to(dtype);
}

void CrossEntropyChunkStats(const at::Tensor& logits, int64_t vocab_offset, const at::Tensor& targets, int64_t vocab,
                            at::Tensor& run_max, at::Tensor& run_sum, at::Tensor& picked) {
  CheckRowArguments(logits, targets, {&run_max, &run_sum, &picked});
#if SLIDE_HAVE_CUDA
  if (UseFusedKernels(logits) && logits.is_contiguous()) {
    const c10::cuda::CUDAGuard guard(logits.device());
    Check(cuda::CrossEntropyStats(KernelDtype(logits), logits.data_ptr(), logits.size(0), logits.size(1), vocab_offset,
                                  targets.data_ptr<int64_t>(), vocab, run_max.data_ptr<float>(),
                                  run_sum.data_ptr<float>(), picked.data_ptr<float>(), Stream()),
          "cross-entropy stats");
    return;
  }
#endif
  const at::Tensor lf = logits.to(at::kFloat);
  // Rows whose chunk (or running state) is all -inf shift by 0 instead of -inf, which would make NaN of them.
  auto finite_or_zero = [](const at::Tensor& m) { return at::where(m.isneginf(), at::zeros_like(m), m); };
  const at::Tensor chunk_max = std::get<0>(lf.max(1));
  const at::Tensor chunk_shift = finite_or_zero(chunk_max);
  const at::Tensor chunk_sum = (lf - chunk_shift.unsqueeze(1)).exp_().sum(1);  // relative to chunk_shift
  const at::Tensor new_max = at::maximum(run_max, chunk_max);
  const at::Tensor new_shift = finite_or_zero(new_max);
  run_sum.copy_(run_sum * (run_max - new_shift).exp() + chunk_sum * (chunk_shift - new_shift).exp());
  run_max.copy_(new_max);
  const ChunkTargets t = TargetsInChunk(targets, vocab_offset, logits.size(1), vocab);
  picked.copy_(at::where(t.in_chunk, lf.gather(1, t.column).squeeze(1), picked));
}

void CrossEntropyChunkGrad(at::Tensor& logits, int64_t vocab_offset, const at::Tensor& targets, int64_t vocab,
                           const at::Tensor& lse, double scale) {
  CheckRowArguments(logits, targets, {&lse});
#if SLIDE_HAVE_CUDA
  if (UseFusedKernels(logits) && logits.is_contiguous()) {
    const c10::cuda::CUDAGuard guard(logits.device());
    Check(cuda::CrossEntropyGrad(KernelDtype(logits), logits.data_ptr(), logits.size(0), logits.size(1), vocab_offset,
                                 targets.data_ptr<int64_t>(), vocab, lse.data_ptr<float>(), static_cast<float>(scale),
                                 Stream()),
          "cross-entropy grad");
    return;
  }
#endif
  const at::Tensor row_scale = (targets.ge(0) & targets.lt(vocab)).to(at::kFloat) * scale;  // [rows]
  at::Tensor g = (logits.to(at::kFloat) - lse.unsqueeze(1)).exp_().mul_(row_scale.unsqueeze(1));
  const ChunkTargets t = TargetsInChunk(targets, vocab_offset, logits.size(1), vocab);
  g.scatter_add_(1, t.column, (-row_scale * t.in_chunk.to(at::kFloat)).unsqueeze(1));
  logits.copy_(g);
}

}  // namespace slide
