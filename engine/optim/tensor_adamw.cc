#include "engine/optim/tensor_adamw.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "engine/optim/adamw_8bit.h"

#if SLIDE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/cuda_launchers.h"
#endif

namespace slide {
namespace {

// `t` is contiguous, of `dtype` and `numel` elements, on param's device.
void CheckState(const char* fn, const at::Tensor& param, const at::Tensor& t, at::ScalarType dtype, int64_t numel) {
  TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous() && t.numel() == numel, fn, ": a state tensor is not ",
              "contiguous ", dtype, " of ", numel, " elements");
  TORCH_CHECK(t.device() == param.device(), fn, ": the state must live on one device");
}

// The gradient (fp32 or bf16) and the optional bf16 output, each of param's size on its device.
void CheckGradAndOut(const char* fn, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& out) {
  const int64_t n = param.numel();
  TORCH_CHECK(grad.numel() == n && grad.is_contiguous() && grad.device() == param.device(), fn,
              ": the gradient must be contiguous, of the state's size and on its device");
  TORCH_CHECK(grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kBFloat16, fn,
              ": the gradient must be fp32 or bf16");
  if (out.defined())
    TORCH_CHECK(
        out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.numel() == n && out.device() == param.device(),
        fn, ": the output must be contiguous bf16 of the state's size on its device");
}

// The gradient (whichever of grad_f32 / grad_bf16 its type says), the optional bf16 output and the size of a CPU span
// (AdamWSpan or AdamW8bitSpan).
template <class Span>
void SetGradAndOut(Span* span, const at::Tensor& grad, const at::Tensor& out) {
  if (grad.scalar_type() == at::kFloat) {
    span->grad_f32 = grad.data_ptr<float>();
  } else {
    span->grad_bf16 = reinterpret_cast<const c10::BFloat16*>(grad.data_ptr());
  }
  if (out.defined()) span->out_bf16 = reinterpret_cast<c10::BFloat16*>(out.data_ptr());
  span->n = grad.numel();
}

}  // namespace

void TensorAdamW(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                 const at::Tensor& grad, const at::Tensor& out, const AdamWStepArgs& args, SimdLevel simd) {
  const int64_t n = param.numel();
  for (const at::Tensor* t : {&param, &exp_avg, &exp_avg_sq}) CheckState("TensorAdamW", param, *t, at::kFloat, n);
  CheckGradAndOut("TensorAdamW", param, grad, out);
  if (param.is_cpu()) {
    AdamWSpan span;
    span.param = param.data_ptr<float>();
    span.exp_avg = exp_avg.data_ptr<float>();
    span.exp_avg_sq = exp_avg_sq.data_ptr<float>();
    SetGradAndOut(&span, grad, out);
    CpuAdamW(span, args, simd);
    return;
  }
#if SLIDE_HAVE_CUDA
  TORCH_CHECK(param.is_cuda(), "TensorAdamW: tensors on ", param.device(), " are not supported");
  c10::cuda::CUDAGuard guard(param.device());
  const cudaError_t err = cuda::AdamW(param.data_ptr<float>(), exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
                                      grad.scalar_type() == at::kFloat ? cuda::DType::kFloat : cuda::DType::kBFloat16,
                                      grad.data_ptr(), out.defined() ? out.data_ptr() : nullptr, n,
                                      MakeAdamWScalars(args), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "AdamW kernel: ", cudaGetErrorString(err));
#else
  TORCH_CHECK(false, "TensorAdamW: tensors on ", param.device(), " need a CUDA build");
#endif
}

void TensorAdamW8bit(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_absmax,
                     const at::Tensor& exp_avg_sq, const at::Tensor& exp_avg_sq_absmax, const at::Tensor& grad,
                     const at::Tensor& out, const AdamWStepArgs& args, SimdLevel simd) {
  const char* fn = "TensorAdamW8bit";
  const int64_t n = param.numel(), blocks = (n + kQuantBlock - 1) / kQuantBlock;
  CheckState(fn, param, param, at::kFloat, n);
  CheckState(fn, param, exp_avg, at::kByte, n);
  CheckState(fn, param, exp_avg_sq, at::kByte, n);
  CheckState(fn, param, exp_avg_absmax, at::kFloat, blocks);
  CheckState(fn, param, exp_avg_sq_absmax, at::kFloat, blocks);
  CheckGradAndOut(fn, param, grad, out);
  if (param.is_cpu()) {
    AdamW8bitSpan span;
    span.param = param.data_ptr<float>();
    span.exp_avg = exp_avg.data_ptr<uint8_t>();
    span.exp_avg_absmax = exp_avg_absmax.data_ptr<float>();
    span.exp_avg_sq = exp_avg_sq.data_ptr<uint8_t>();
    span.exp_avg_sq_absmax = exp_avg_sq_absmax.data_ptr<float>();
    SetGradAndOut(&span, grad, out);
    CpuAdamW8bit(span, args, simd);
    return;
  }
#if SLIDE_HAVE_CUDA
  TORCH_CHECK(param.is_cuda(), fn, ": tensors on ", param.device(), " are not supported");
  c10::cuda::CUDAGuard guard(param.device());
  static const cuda::DynamicMaps maps = [] {
    cuda::DynamicMaps m;
    std::copy(SignedDynamicMap().begin(), SignedDynamicMap().end(), m.signed_map);
    std::copy(UnsignedDynamicMap().begin(), UnsignedDynamicMap().end(), m.unsigned_map);
    return m;
  }();
  const cudaError_t err = cuda::AdamW8bit(
      param.data_ptr<float>(), exp_avg.data_ptr<uint8_t>(), exp_avg_absmax.data_ptr<float>(),
      exp_avg_sq.data_ptr<uint8_t>(), exp_avg_sq_absmax.data_ptr<float>(),
      grad.scalar_type() == at::kFloat ? cuda::DType::kFloat : cuda::DType::kBFloat16, grad.data_ptr(),
      out.defined() ? out.data_ptr() : nullptr, n, MakeAdamWScalars(args), maps, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "AdamW8bit kernel: ", cudaGetErrorString(err));
#else
  TORCH_CHECK(false, fn, ": tensors on ", param.device(), " need a CUDA build");
#endif
}

}  // namespace slide
