#include "engine/runtime/sliding_trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>

namespace slide {
namespace {

class ScopedTimer {
 public:
  explicit ScopedTimer(double& sink) : sink_(sink), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  double& sink_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

SlidingTrainer::SlidingTrainer(ModelConfig cfg, const ModelParams& master_fp32, SlidingOptions options)
    : cfg_(std::move(cfg)), layout_(master_fp32.layout), opts_(std::move(options)), simd_(DetectSimdLevel()) {
  const auto dtype = opts_.train.compute_dtype;
  TORCH_CHECK(dtype == c10::kBFloat16 || dtype == c10::kFloat, "sliding trainer computes in bf16 or fp32");
  TORCH_CHECK(opts_.window >= 1, "window must be at least 1 slot");
  on_cuda_ = opts_.train.device.is_cuda();
  device_opts_ = at::TensorOptions().dtype(dtype).device(opts_.train.device);
  const auto host_f32 = at::TensorOptions().dtype(at::kFloat);
  const auto host_compute = at::TensorOptions().dtype(dtype).pinned_memory(on_cuda_);

  master_ = master_fp32.To(host_f32);
  exp_avg_ = ZeroParams(layout_, host_f32);
  exp_avg_sq_ = ZeroParams(layout_, host_f32);
  const size_t n_units = layout_.units.size();
  unit_sqnorm_.assign(n_units, 0.0);
  for (size_t u = 0; u < n_units; ++u) {
    const int64_t numel = layout_.units[u].numel;
    if (dtype == c10::kFloat && !on_cuda_) {
      staging_.push_back(master_.units[u]);  // fp32 on the host: the master is what the forward loads
    } else {
      staging_.push_back(at::empty({numel}, host_compute));
      staging_.back().copy_(master_.units[u]);
    }
    grad_host_.push_back(at::empty({numel}, host_compute));
  }

  int64_t slot_numel = 0;
  for (int64_t i = 0; i < layout_.num_layers(); ++i) slot_numel = std::max(slot_numel, layout_.layer(i).numel);
  for (int64_t w = 0; w < opts_.window; ++w) slots_.push_back(at::empty({slot_numel}, device_opts_));
  slot_layer_.assign(opts_.window, -1);
  slot_version_.assign(opts_.window, -1);
  embed_dev_ = at::empty({layout_.embed().numel}, device_opts_);
  head_dev_ = at::empty({layout_.head().numel}, device_opts_);
  worker_ = std::make_unique<UpdateWorker>(n_units);
}

SlidingTrainer::~SlidingTrainer() { worker_->WaitAll(); }

at::Tensor SlidingTrainer::LoadLayer(int64_t layer) {
  const int64_t w = layer % opts_.window;
  const int64_t numel = layout_.layer(layer).numel;
  at::Tensor view = slots_[w].narrow(0, 0, numel);
  if (slot_layer_[w] == layer && slot_version_[w] == weights_version_) return view;
  {
    ScopedTimer t(busy_.wait_update);
    worker_->Wait(1 + layer);
  }
  {
    ScopedTimer t(busy_.h2d);
    view.copy_(staging_[1 + layer]);
  }
  slot_layer_[w] = layer;
  slot_version_[w] = weights_version_;
  ++slot_loads_;
  return view;
}

void SlidingTrainer::LoadEdgeUnits() {
  if (edge_version_ == weights_version_) return;
  const size_t head = layout_.units.size() - 1;
  {
    ScopedTimer t(busy_.wait_update);
    worker_->Wait(0);
    worker_->Wait(head);
  }
  ScopedTimer t(busy_.h2d);
  embed_dev_.copy_(staging_[0]);
  head_dev_.copy_(staging_[head]);
  edge_version_ = weights_version_;
  slot_loads_ += 2;
}

at::Tensor SlidingTrainer::Park(const at::Tensor& x, int64_t index) {
  if (!opts_.checkpoints_on_host || !on_cuda_) return x;
  if (parked_host_.size() <= static_cast<size_t>(index)) parked_host_.resize(index + 1);
  at::Tensor& host = parked_host_[index];
  if (!host.defined() || host.sizes() != x.sizes())
    host = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(true));
  ScopedTimer t(busy_.d2h);
  host.copy_(x);
  return host;
}

at::Tensor SlidingTrainer::Unpark(const at::Tensor& parked) {
  if (parked.device() == opts_.train.device) return parked;
  ScopedTimer t(busy_.h2d);
  return parked.to(opts_.train.device);
}

void SlidingTrainer::LandGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last) {
  {
    ScopedTimer t(busy_.wait_update);
    worker_->Wait(unit);  // the previous micro-batch's accumulation may still read grad_host_[unit]
  }
  {
    ScopedTimer t(busy_.d2h);
    grad_host_[unit].copy_(device_grad);
  }
  const bool accumulate = accum_ > 1;
  worker_->Post(unit, [this, unit, first, last, accumulate] {
    at::Tensor src = grad_host_[unit];
    if (accumulate) {
      if (first) {
        grad_accum_[unit].copy_(src);
      } else {
        grad_accum_[unit].add_(src);
      }
      src = grad_accum_[unit];
    }
    if (last) {
      const double norm = at::linalg_vector_norm(src, 2, {}, false, at::kFloat).item<double>();
      unit_sqnorm_[unit] = norm * norm;
    }
  });
}

void SlidingTrainer::PostUpdate(size_t unit, double lr, float grad_scale, int64_t step) {
  worker_->Post(unit, [this, unit, lr, grad_scale, step] {
    const bool f32_grad = accum_ > 1 || opts_.train.compute_dtype == c10::kFloat;
    const at::Tensor& grad = accum_ > 1 ? grad_accum_[unit] : grad_host_[unit];
    const bool write_bf16 = opts_.train.compute_dtype == c10::kBFloat16;
    const bool copy_f32 = !write_bf16 && staging_[unit].data_ptr() != master_.units[unit].data_ptr();
    AdamWStepArgs args;
    args.hp = opts_.train.adamw;
    args.hp.lr = lr;
    args.step = step;
    args.grad_scale = grad_scale;
    for (const auto& spec : layout_.units[unit].params) {
      AdamWStepArgs a = args;
      if (!spec.weight_decay) a.hp.weight_decay = 0;
      AdamWSpan span;
      span.param = master_.units[unit].data_ptr<float>() + spec.offset;
      span.exp_avg = exp_avg_.units[unit].data_ptr<float>() + spec.offset;
      span.exp_avg_sq = exp_avg_sq_.units[unit].data_ptr<float>() + spec.offset;
      if (f32_grad) {
        span.grad_f32 = grad.data_ptr<float>() + spec.offset;
      } else {
        span.grad_bf16 = reinterpret_cast<const c10::BFloat16*>(grad.data_ptr()) + spec.offset;
      }
      if (write_bf16) span.out_bf16 = reinterpret_cast<c10::BFloat16*>(staging_[unit].data_ptr()) + spec.offset;
      span.n = spec.numel;
      CpuAdamW(span, a, simd_);
    }
    if (copy_f32) staging_[unit].copy_(master_.units[unit]);
  });
}

StepStats SlidingTrainer::Step(const std::vector<MicroBatch>& micro_batches) {
  TORCH_CHECK(!micro_batches.empty(), "a step needs at least one micro-batch");
  std::string pending_error = worker_->TakeError();
  TORCH_CHECK(pending_error.empty(), "optimizer update failed: ", pending_error);
  const double update_before = worker_->busy_seconds();
  busy_ = ResourceBusy{};
  ScopedTimer step_timer(busy_.step);

  accum_ = static_cast<int64_t>(micro_batches.size());
  if (accum_ > 1 && grad_accum_.empty())
    for (const auto& u : layout_.units) grad_accum_.push_back(at::empty({u.numel}, at::kFloat));

  StepStats stats;
  for (const auto& mb : micro_batches) stats.valid_targets += CountValidTargets(mb.targets);
  const double normalizer = std::max<int64_t>(1, stats.valid_targets);
  const bool clip = opts_.train.max_grad_norm > 0;
  const double lr = opts_.train.schedule.At(step_);
  const int64_t L = layout_.num_layers();
  const size_t head_unit = layout_.units.size() - 1;

  LoadEdgeUnits();
  for (size_t mb = 0; mb < micro_batches.size(); ++mb) {
    const bool first = mb == 0, last = mb + 1 == micro_batches.size();
    at::Tensor ids = micro_batches[mb].input_ids.to(opts_.train.device);
    at::Tensor targets = micro_batches[mb].targets.to(opts_.train.device);
    RopeTables rope = BuildRopeTables(cfg_, ids.size(1), device_opts_);

    // Forward without autograd, keeping each layer's input.
    std::vector<at::Tensor> parked(L);
    at::Tensor x;
    {
      at::AutoGradMode no_grad(false);
      {
        ScopedTimer t(busy_.compute);
        x = EmbeddingForward(layout_.embed(), embed_dev_, ids);
      }
      for (int64_t i = 0; i < L; ++i) {
        parked[i] = Park(x, i);
        at::Tensor w = LoadLayer(i);
        ScopedTimer t(busy_.compute);
        x = DecoderLayerForward(cfg_, layout_.layer(i), w, x, rope);
      }
    }

    // Head: forward and backward at once (the chunked loss computes its gradients in the forward).
    at::Tensor embed_leaf = embed_dev_.detach().requires_grad_(true);
    at::Tensor head_leaf = head_dev_.detach().requires_grad_(true);
    at::Tensor dx;
    {
      at::Tensor xl = x.detach().requires_grad_(true);
      ScopedTimer t(busy_.compute);
      at::Tensor loss = HeadLoss(cfg_, layout_.head(), head_leaf, LmHeadWeight(layout_, embed_leaf, head_leaf), xl,
                                 targets, normalizer, opts_.train.loss);
      loss.backward();
      stats.loss += loss.item<double>();
      dx = xl.grad();
    }
    LandGrad(head_unit, head_leaf.grad(), first, last);
    if (last && !clip) PostUpdate(head_unit, lr, 1.0f, step_ + 1);

    // Backward through the layers in reverse, recomputing each from its saved input.
    for (int64_t i = L - 1; i >= 0; --i) {
      at::Tensor w = LoadLayer(i).detach().requires_grad_(true);
      at::Tensor xi = Unpark(parked[i]).detach().requires_grad_(true);
      {
        ScopedTimer t(busy_.compute);
        at::Tensor y = DecoderLayerForward(cfg_, layout_.layer(i), w, xi, rope);
        y.backward(dx);
        dx = xi.grad();
      }
      parked[i] = at::Tensor();
      LandGrad(1 + i, w.grad(), first, last);
      if (last && !clip) PostUpdate(1 + i, lr, 1.0f, step_ + 1);
    }

    // Embedding backward; with tied weights embed_leaf already holds the LM head's share.
    {
      ScopedTimer t(busy_.compute);
      at::Tensor x0 = EmbeddingForward(layout_.embed(), embed_leaf, ids);
      x0.backward(dx);
    }
    LandGrad(0, embed_leaf.grad(), first, last);
    if (last && !clip) PostUpdate(0, lr, 1.0f, step_ + 1);
  }

  // Exact global-norm clipping needs every unit's norm before any update.
  {
    ScopedTimer t(busy_.wait_update);
    worker_->WaitAll();
  }
  double sq = 0;
  for (double s : unit_sqnorm_) sq += s;
  stats.grad_norm = std::sqrt(sq);
  if (clip) {
    const float coef = static_cast<float>(std::min(1.0, opts_.train.max_grad_norm / (stats.grad_norm + 1e-6)));
    for (size_t u = 0; u < layout_.units.size(); ++u) PostUpdate(u, lr, coef, step_ + 1);  // forward order
  }
  ++step_;
  ++weights_version_;
  stats.step = step_;
  stats.lr = lr;
  busy_.cpu_update = worker_->busy_seconds() - update_before;
  return stats;
}

ModelParams SlidingTrainer::Master() {
  worker_->WaitAll();
  return master_.To(at::TensorOptions().dtype(at::kFloat));
}

}  // namespace slide
