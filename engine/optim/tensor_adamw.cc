#include "engine/optim/tensor_adamw.h"

#include <c10/util/Exception.h>

#if SLIDE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/cuda_launchers.h"
#endif

namespace slide {

void TensorAdamW(const at::Tensor& param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                 const at::Tensor& grad, const at::Tensor& out, const AdamWStepArgs& args, SimdLevel simd) {
  const int64_t n = param.numel();
  for (const at::Tensor* t : {&param, &exp_avg, &exp_avg_sq}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == n,
                "TensorAdamW: the state must be contiguous fp32 of one size");
    TORCH_CHECK(t->device() == param.device(), "TensorAdamW: the state must live on one device");
  }
  TORCH_CHECK(grad.numel() == n && grad.is_contiguous() && grad.device() == param.device(),
              "TensorAdamW: the gradient must be contiguous, of the state's size and on its device");
  TORCH_CHECK(grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kBFloat16,
              "TensorAdamW: the gradient must be fp32 or bf16");
  if (out.defined())
    TORCH_CHECK(
        out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.numel() == n && out.device() == param.device(),
        "TensorAdamW: the output must be contiguous bf16 of the state's size on its device");
  if (param.is_cpu()) {
    AdamWSpan span;
    span.param = param.data_ptr<float>();
    span.exp_avg = exp_avg.data_ptr<float>();
    span.exp_avg_sq = exp_avg_sq.data_ptr<float>();
    if (grad.scalar_type() == at::kFloat) {
      span.grad_f32 = grad.data_ptr<float>();
    } else {
      span.grad_bf16 = reinterpret_cast<const c10::BFloat16*>(grad.data_ptr());
    }
    if (out.defined()) span.out_bf16 = reinterpret_cast<c10::BFloat16*>(out.data_ptr());
    span.n = n;
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

}  // namespace slide
