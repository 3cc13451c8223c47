#include "engine/runtime/reference_trainer.h"

#include <ATen/ATen.h>

#include <cmath>

#include "engine/optim/adamw_8bit.h"

namespace slide {

at::Tensor ShiftLabels(const at::Tensor& labels) {
  at::Tensor targets = at::full_like(labels, kIgnoreIndex);
  const int64_t S = labels.size(1);
  targets.narrow(1, 0, S - 1).copy_(labels.narrow(1, 1, S - 1));
  return targets;
}

double ClipGradNorm(std::vector<at::Tensor>& grads, double max_norm) {
  std::vector<at::Tensor> norms;
  for (const auto& g : grads) norms.push_back(at::linalg_vector_norm(g.to(at::kFloat), 2));
  const double total = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
  if (max_norm > 0) {
    const double coef = std::min(1.0, max_norm / (total + 1e-6));
    for (auto& g : grads) g.mul_(coef);
  }
  return total;
}

ReferenceTrainer::ReferenceTrainer(ModelConfig cfg, ModelParams master_fp32, TrainerOptions options)
    : cfg_(std::move(cfg)), options_(std::move(options)) {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(options_.device);
  master_ = master_fp32.To(fp32);
  for (const auto& unit : master_.layout.units) {
    moment_layout_.emplace_back(options_.optimizer, unit);
    const MomentLayout& m = moment_layout_.back();
    exp_avg_.push_back(at::zeros({m.numel()}, fp32.dtype(m.dtype())));
    exp_avg_sq_.push_back(at::zeros({m.numel()}, fp32.dtype(m.dtype())));
  }
}

namespace {

// The fp32 values at `byte_offset` of a moment buffer (MomentLayout), and a tensor view of n of them.
float* FloatsAt(const at::Tensor& buffer, int64_t byte_offset) {
  return reinterpret_cast<float*>(static_cast<uint8_t*>(buffer.data_ptr()) + byte_offset);
}
at::Tensor FloatView(const at::Tensor& buffer, int64_t byte_offset, int64_t n) {
  return at::from_blob(FloatsAt(buffer, byte_offset), {n}, buffer.options().dtype(at::kFloat));
}

// One parameter's AdamW step with 8-bit moments: dequantised, the reference step in fp32, requantised blockwise.
void Reference8bitStep(at::Tensor& p, const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                       const MomentLayout::Param& where, const AdamWHyper& hp, int64_t step) {
  const int64_t n = p.numel();
  if (!where.quantized) {
    at::Tensor m = FloatView(exp_avg, where.values, n).view(p.sizes());
    at::Tensor v = FloatView(exp_avg_sq, where.values, n).view(p.sizes());
    AdamWReferenceStep(p, grad, m, v, hp, step);
    return;
  }
  const auto moment = [&](const at::Tensor& buffer, const std::array<float, 256>& map) {
    at::Tensor x = at::empty(p.sizes(), at::kFloat);  // contiguous, as the parameter's view is
    DequantizeBlockwise(buffer.data_ptr<uint8_t>() + where.values, FloatsAt(buffer, where.absmax), n, map,
                        x.data_ptr<float>());
    return x;
  };
  at::Tensor m = moment(exp_avg, SignedDynamicMap()), v = moment(exp_avg_sq, UnsignedDynamicMap());
  AdamWReferenceStep(p, grad, m, v, hp, step);
  QuantizeBlockwise(m.data_ptr<float>(), n, SignedDynamicMap(), exp_avg.data_ptr<uint8_t>() + where.values,
                    FloatsAt(exp_avg, where.absmax));
  QuantizeBlockwise(v.data_ptr<float>(), n, UnsignedDynamicMap(), exp_avg_sq.data_ptr<uint8_t>() + where.values,
                    FloatsAt(exp_avg_sq, where.absmax));
}

}  // namespace

void ReferenceUnitStep(at::Tensor& master, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                       const UnitLayout& unit, const MomentLayout& moments, const AdamWHyper& hp, int64_t step) {
  const bool q8 = moments.kind() == OptimizerKind::kAdamW8bit;
  // The reference's blockwise codec is the CPU's: on a device, 8-bit moments step host copies of the unit's state,
  // written back after, so a device kernel under test is checked against the CPU body.
  const bool host_copies = q8 && !master.device().is_cpu();
  at::Tensor m_flat = master, g_flat = grad, ea = exp_avg, eas = exp_avg_sq;
  if (host_copies) {
    m_flat = master.cpu();
    g_flat = grad.cpu();
    ea = exp_avg.cpu();
    eas = exp_avg_sq.cpu();
  }
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const ParamSpec& spec = unit.params[i];
    AdamWHyper p_hp = hp;
    if (!spec.weight_decay) p_hp.weight_decay = 0;
    at::Tensor p = ParamView(spec, m_flat);
    if (q8) {
      Reference8bitStep(p, ParamView(spec, g_flat), ea, eas, moments.params()[i], p_hp, step);
      continue;
    }
    at::Tensor m = ParamView(spec, ea);
    at::Tensor v = ParamView(spec, eas);
    AdamWReferenceStep(p, ParamView(spec, g_flat), m, v, p_hp, step);
  }
  if (host_copies) {
    master.copy_(m_flat);
    exp_avg.copy_(ea);
    exp_avg_sq.copy_(eas);
  }
}

StepStats ReferenceTrainer::Step(const std::vector<MicroBatch>& micro_batches) {
  TORCH_CHECK(!micro_batches.empty(), "a step needs at least one micro-batch");
  StepStats stats;
  for (const auto& mb : micro_batches) stats.valid_targets += CheckedTargetCount(mb.targets, cfg_.vocab_size);
  const double normalizer = std::max<int64_t>(1, stats.valid_targets);

  // Compute-dtype copies of the master are the autograd leaves; their grads are folded into fp32 after each
  // micro-batch so accumulation never happens in bf16.
  ModelParams compute = master_.To(at::TensorOptions().dtype(options_.compute_dtype).device(options_.device));
  for (auto& t : compute.units) t.requires_grad_(true);
  ModelParams grads = ZeroParams(master_.layout, at::TensorOptions().dtype(at::kFloat).device(options_.device));

  for (const auto& mb : micro_batches) {
    at::Tensor loss = ModelLoss(cfg_, compute, mb.input_ids.to(options_.device), mb.targets.to(options_.device),
                                normalizer, options_.loss);
    loss.backward();
    stats.loss += loss.item<double>();
    for (size_t u = 0; u < compute.units.size(); ++u) {
      grads.units[u].add_(compute.units[u].grad());
      compute.units[u].mutable_grad().zero_();
    }
  }

  stats.grad_norm = ClipGradNorm(grads.units, options_.max_grad_norm);
  stats.lr = options_.schedule.At(step_);
  ++step_;
  stats.step = step_;

  AdamWHyper hp = options_.adamw;
  hp.lr = stats.lr;
  for (size_t u = 0; u < master_.layout.units.size(); ++u) {
    ReferenceUnitStep(master_.units[u], grads.units[u], exp_avg_[u], exp_avg_sq_[u], master_.layout.units[u],
                      moment_layout_[u], hp, step_);
  }
  return stats;
}

}  // namespace slide
