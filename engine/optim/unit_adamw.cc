#include "engine/optim/unit_adamw.h"

#include <algorithm>
#include <cstring>

#include "engine/optim/adamw_8bit.h"
#include "engine/optim/tensor_adamw.h"

namespace slide {

AdamWStepArgs ParamStepArgs(const ParamSpec& spec, const AdamWStepArgs& unit_args) {
  AdamWStepArgs a = unit_args;
  if (!spec.weight_decay) a.hp.weight_decay = 0;
  return a;
}

void HostUnitAdamW(const UnitLayout& unit, const HostUnitRange& r, const AdamWStepArgs& args, SimdLevel simd) {
  const bool f32_grad = r.grad.scalar_type() == at::kFloat;
  const bool write_bf16 = r.weights_out.scalar_type() == at::kBFloat16;
  const int64_t end = r.begin + r.n;
  for (const auto& spec : unit.params) {
    const int64_t lo = std::max(r.begin, spec.offset), hi = std::min(end, spec.offset + spec.numel);
    if (lo >= hi) continue;
    AdamWSpan span;
    span.param = r.master + (lo - r.begin);
    span.exp_avg = r.exp_avg + (lo - r.begin);
    span.exp_avg_sq = r.exp_avg_sq + (lo - r.begin);
    if (f32_grad) {
      span.grad_f32 = r.grad.data_ptr<float>() + lo;
    } else {
      span.grad_bf16 = reinterpret_cast<const c10::BFloat16*>(r.grad.data_ptr()) + lo;
    }
    if (write_bf16) span.out_bf16 = reinterpret_cast<c10::BFloat16*>(r.weights_out.data_ptr()) + lo;
    if (r.weights_only_out != nullptr) {
      span.out_bf16 = r.weights_only_out + (lo - r.begin);
      span.weights_only = true;
    }
    span.n = hi - lo;
    CpuAdamW(span, ParamStepArgs(spec, args), simd);
  }
  if (r.weights_only_out != nullptr) return;
  // fp32 compute with its own weights buffer (CUDA, or a master on disk): the forward loads a copy of the master.
  const bool copy_f32 = !write_bf16 && r.weights_out.data_ptr<float>() + r.begin != r.master;
  if (copy_f32) std::memcpy(r.weights_out.data_ptr<float>() + r.begin, r.master, r.n * sizeof(float));
}

void HostUnitAdamW8bit(const UnitLayout& unit, const MomentLayout& moments, const HostUnit8bitRange& r,
                       const AdamWStepArgs& args, SimdLevel simd) {
  TORCH_CHECK(moments.kind() == OptimizerKind::kAdamW8bit, "HostUnitAdamW8bit needs 8-bit moments");
  const bool weights_only = r.weights_only_out != nullptr;
  TORCH_CHECK(weights_only || (r.begin == 0 && r.n == unit.numel),
              "an 8-bit update requantises whole blocks: it takes the whole unit");
  const bool f32_grad = r.grad.scalar_type() == at::kFloat;
  const bool write_bf16 = r.weights_out.scalar_type() == at::kBFloat16;
  const int64_t end = r.begin + r.n;
  for (size_t p = 0; p < unit.params.size(); ++p) {
    const ParamSpec& spec = unit.params[p];
    const MomentLayout::Param& where = moments.params()[p];
    const int64_t lo = std::max(r.begin, spec.offset), hi = std::min(end, spec.offset + spec.numel);
    if (lo >= hi) continue;
    const AdamWStepArgs param_args = ParamStepArgs(spec, args);
    const c10::BFloat16* grad_bf16 =
        f32_grad ? nullptr : reinterpret_cast<const c10::BFloat16*>(r.grad.data_ptr()) + spec.offset;
    const float* grad_f32 = f32_grad ? r.grad.data_ptr<float>() + spec.offset : nullptr;
    c10::BFloat16* out = write_bf16 && !weights_only
                             ? reinterpret_cast<c10::BFloat16*>(r.weights_out.data_ptr()) + spec.offset
                             : nullptr;
    if (!where.quantized) {  // a small parameter: fp32 moments, the plain update
      AdamWSpan span;
      span.param = r.master + (lo - r.begin);
      span.exp_avg = reinterpret_cast<float*>(r.exp_avg + where.values) + (lo - spec.offset);
      span.exp_avg_sq = reinterpret_cast<float*>(r.exp_avg_sq + where.values) + (lo - spec.offset);
      span.grad_bf16 = grad_bf16 != nullptr ? grad_bf16 + (lo - spec.offset) : nullptr;
      span.grad_f32 = grad_f32 != nullptr ? grad_f32 + (lo - spec.offset) : nullptr;
      span.out_bf16 = weights_only ? r.weights_only_out + (lo - r.begin) : out;
      span.weights_only = weights_only;
      span.n = hi - lo;
      CpuAdamW(span, param_args, simd);
      continue;
    }
    AdamW8bitSpan span;  // the whole parameter; the pass below takes [lo, hi) of it
    span.param = r.master + (spec.offset - r.begin);
    span.exp_avg = r.exp_avg + where.values;
    span.exp_avg_absmax = reinterpret_cast<float*>(r.exp_avg + where.absmax);
    span.exp_avg_sq = r.exp_avg_sq + where.values;
    span.exp_avg_sq_absmax = reinterpret_cast<float*>(r.exp_avg_sq + where.absmax);
    span.grad_bf16 = grad_bf16;
    span.grad_f32 = grad_f32;
    span.out_bf16 = out;
    span.n = spec.numel;
    if (weights_only) {
      CpuAdamW8bitWeightsOnly(span, lo - spec.offset, hi - spec.offset, r.weights_only_out + (lo - r.begin), param_args,
                              simd);
    } else {
      CpuAdamW8bit(span, param_args, simd);
    }
  }
  if (weights_only) return;
  const bool copy_f32 = !write_bf16 && r.weights_out.data_ptr<float>() != r.master;
  if (copy_f32) std::memcpy(r.weights_out.data_ptr<float>(), r.master, r.n * sizeof(float));
}

void ParamAdamW(const MomentLayout::Param& where, const at::Tensor& master, const at::Tensor& exp_avg,
                const at::Tensor& exp_avg_sq, const at::Tensor& grad, const at::Tensor& weights_bf16,
                const AdamWStepArgs& args, SimdLevel simd) {
  const int64_t n = master.numel();
  const at::Tensor m = exp_avg.view(at::kByte), v = exp_avg_sq.view(at::kByte);
  auto floats = [](const at::Tensor& bytes, int64_t byte_offset, int64_t count) {
    return bytes.narrow(0, byte_offset, 4 * count).view(at::kFloat);
  };
  if (!where.quantized) {
    TensorAdamW(master, floats(m, where.values, n), floats(v, where.values, n), grad, weights_bf16, args, simd);
    return;
  }
  const int64_t blocks = MomentLayout::Blocks(n);
  TensorAdamW8bit(master, m.narrow(0, where.values, n), floats(m, where.absmax, blocks), v.narrow(0, where.values, n),
                  floats(v, where.absmax, blocks), grad, weights_bf16, args, simd);
}

void DeviceUnitAdamW(const UnitLayout& unit, const MomentLayout& moments, const at::Tensor& master,
                     const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& grad,
                     const at::Tensor& weights_bf16, const AdamWStepArgs& args, SimdLevel simd) {
  for (size_t p = 0; p < unit.params.size(); ++p) {
    const ParamSpec& spec = unit.params[p];
    auto part = [&](const at::Tensor& t) { return t.narrow(0, spec.offset, spec.numel); };
    ParamAdamW(moments.params()[p], part(master), exp_avg, exp_avg_sq, part(grad),
               weights_bf16.defined() ? part(weights_bf16) : at::Tensor(), ParamStepArgs(spec, args), simd);
  }
}

}  // namespace slide
