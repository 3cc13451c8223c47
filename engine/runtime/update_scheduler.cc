#include "engine/runtime/update_scheduler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "engine/optim/unit_adamw.h"
#include "engine/runtime/device_queue.h"
#include "engine/runtime/step_meter.h"
#include "engine/runtime/unit_store.h"

namespace slide {

UpdateScheduler::UpdateScheduler(UnitStore& units, DeviceQueue& queue, StepMeter& meter, const SlidingOptions& options,
                                 SimdLevel simd)
    : units_(units),
      queue_(queue),
      meter_(meter),
      options_(options),
      simd_(simd),
      n_units_(units.size()),
      weights_first_mode_(options.weights_first) {
  if (options.device_update_share > 0) {  // as the plan counts it, even where no layer streams
    queue_.EnableStreamedUpdates(options.device_update_chunk, 3, n_units_, simd);
    stream_worker_ = std::make_unique<UpdateWorker>(n_units_);
  }
  on_stream_worker_.assign(n_units_, false);
  // Weights first sends the embedding and the head through the ring in chunks of a ring buffer (a layer's size).
  const int64_t buffer_numel = units.largest_layer_numel();
  const ModelLayout& layout = units.layout();
  edge_chunks_max_ = (std::max(layout.embed().numel, layout.head().numel) + buffer_numel - 1) / buffer_numel;
  worker_ = std::make_unique<UpdateWorker>(2 * n_units_ + 2 * edge_chunks_max_);
  layer_ticket_.assign(layout.num_layers(), -1);
  // The ring is page-locked here, where the plan counted it, rather than in the first step that goes weights
  // first (pinning ~1.3 GiB at 8B takes a good part of a second of that step): window + 1 buffers of the largest
  // layer, where some layer can go weights first (streamed layers can), with bf16 compute and clipping.
  bool may_go_weights_first = false;
  for (size_t u = 0; u < n_units_; ++u) may_go_weights_first = may_go_weights_first || WeightsFirstEligible(u);
  if (WeightsFirstAllowed(options) && may_go_weights_first && options.train.compute_dtype == c10::kBFloat16 &&
      options.train.max_grad_norm > 0) {
    std::vector<at::Tensor> buffers;
    for (int64_t r = 0; r <= options.window; ++r)
      buffers.push_back(queue_.AllocateHost(buffer_numel, options.train.compute_dtype));
    ring_ = std::make_unique<WeightRing>(std::move(buffers));
  }
}

UpdateScheduler::~UpdateScheduler() {
  WaitAll();
  try {
    queue_.SyncStreamedUpdates();
  } catch (...) {  // a failed device: destructors must not throw (the job already has the error)
  }
}

// Task ids: [0, n) whole updates, [n, 2n) layers' weights-only passes, then the embedding's chunks and the head's.
size_t UpdateScheduler::TaskId(const UpdateKey& key) const {
  if (key.pass == Pass::kWhole) return key.unit;
  if (key.chunk < 0) return n_units_ + key.unit;
  const bool head = key.unit == units_.head_index();
  return 2 * n_units_ + static_cast<size_t>((head ? edge_chunks_max_ : 0) + key.chunk);
}

UpdateWorker& UpdateScheduler::WorkerFor(const UpdateKey& key) const {
  return key.pass == Pass::kWhole && on_stream_worker_[key.unit] ? *stream_worker_ : *worker_;
}

UpdateWorker& UpdateScheduler::PostWorker(size_t unit) {
  on_stream_worker_[unit] = Streamed(unit);
  return WorkerFor({unit});
}

std::string UpdateScheduler::Name(const UpdateKey& key) {
  if (key.pass == Pass::kWhole) return std::to_string(key.unit);
  return "weights " + std::to_string(key.unit) + (key.chunk >= 0 ? "." + std::to_string(key.chunk) : "");
}

void UpdateScheduler::Wait(const UpdateKey& key, const char* why) {
  UpdateWorker& worker = WorkerFor(key);
  const size_t id = TaskId(key);
  if (worker.Idle(id)) return;
  const double t0 = TraceNow();
  {
    ScopedTimer t(meter_.busy().wait_update);
    worker.Wait(id);
  }
  meter_.AddSpan("engine.wait", std::string(why) + " " + Name(key), t0, TraceNow());
}

// A unit whose state streams is updated through the device, whole: in a step going weights first too (unless the
// options say otherwise: then the CPU updates it with the other host layers), the CPU's weights-only passes and
// whole updates taking the other host layers while the copy engines and the device update it (the next forward's
// load of it waits for its write-back).
bool UpdateScheduler::Streamed(size_t unit) const {
  return units_[unit].stream_capable() && (options_.stream_in_weights_first || !weights_first_step_);
}

bool UpdateScheduler::WeightsFirstEligible(size_t unit) const {
  return unit >= 1 && unit + 1 < n_units_ && units_[unit].host_held() &&
         !(units_[unit].stream_capable() && options_.stream_in_weights_first);
}

bool UpdateScheduler::EdgeWeightsFirstEligible(size_t unit) const {
  return (unit == 0 || unit == units_.head_index()) && units_[unit].host_held();
}

int64_t UpdateScheduler::EdgeChunks(size_t unit) const {
  const int64_t size = ring_->Buffer(0).numel();
  return (units_.layout().units[unit].numel + size - 1) / size;
}

UpdateScheduler::Range UpdateScheduler::EdgeChunk(size_t unit, int64_t chunk) const {
  const int64_t size = ring_->Buffer(0).numel(), begin = chunk * size;
  return {begin, std::min(size, units_.layout().units[unit].numel - begin)};
}

// Off where the weights cannot go first (no ring: fp32 compute, no clipping, no eligible layer, or not allowed when
// the trainer was made) and, automatically, on the CPU device (the passes would take the cores the compute runs on);
// on when the options say so; otherwise the policy's choice, made by the steps' measured times.
bool UpdateScheduler::ChooseWeightsFirst() {
  if (!ring_ || weights_first_mode_ == WeightsFirst::kOff) return false;
  return weights_first_mode_ == WeightsFirst::kOn || (PolicyChooses() && policy_.Choose());
}

bool UpdateScheduler::PolicyChooses() const {
  return ring_ && weights_first_mode_ == WeightsFirst::kAuto && options_.train.device.is_cuda();
}

bool UpdateScheduler::schedule_settled() const { return !PolicyChooses() || policy_.Settled(); }

void UpdateScheduler::set_weights_first(WeightsFirst mode) {
  TORCH_CHECK(mode != WeightsFirst::kOn || ring_,
              "weights first needs a trainer made with it allowed: its ring is made there");
  weights_first_mode_ = mode;
}

bool UpdateScheduler::BeginStep(int64_t micro_batches) {
  ran_weights_first_ = last_posted_weights_first_;  // the last step posted the updates this step runs
  ran_updates_ = updates_posted_;                   // not after a checkpoint or an evaluation waited for them
  updates_posted_ = false;
  last_posted_weights_first_ = false;
  weights_first_step_ = ChooseWeightsFirst();
  accum_ = micro_batches;
  if (accum_ > 1) units_.EnsureGradSums();
  device_sqnorm_.clear();
  return weights_first_step_;
}

void UpdateScheduler::EndStep(double step_s, double compute_s, double cpu_update_s, double whole_adamw_s) {
  // The CPU's whole AdamW per element, over the elements that streamed instead (none when nothing did).
  const double streamed_adamw_s = whole_adamw_s * units_.streamed_per_cpu_element();
  policy_.Record({.step_s = step_s,
                  .compute_s = compute_s,
                  // mostly the updates the last step posted; as if the streamed ones ran on the CPU
                  .cpu_update_s = cpu_update_s + (ran_weights_first_ ? 0 : streamed_adamw_s),
                  .ran_updates = ran_updates_,
                  .ran_weights_first = ran_weights_first_});
}

// A resident unit's gradient stays where it was computed: held for the update (or summed in fp32 across
// micro-batches). The norm uses the same operations as a returned gradient's, so the global norm is unchanged.
void UpdateScheduler::LandResidentGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last) {
  Unit& x = units_[unit];
  if (accum_ == 1) {
    if (last) device_sqnorm_.push_back(at::linalg_vector_norm(device_grad, 2, {}, false, at::kFloat).square());
    x.dev_grad = device_grad;
    return;
  }
  if (!x.dev_grad_sum.defined())
    x.dev_grad_sum = at::empty({units_.layout().units[unit].numel}, device_grad.options().dtype(at::kFloat));
  if (first) {
    x.dev_grad_sum.copy_(device_grad);
  } else {
    x.dev_grad_sum.add_(device_grad);
  }
  if (last) x.dev_norm = at::linalg_vector_norm(x.dev_grad_sum, 2, {}, false, at::kFloat);
}

void UpdateScheduler::LandGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last) {
  if (units_[unit].resident()) return LandResidentGrad(unit, device_grad, first, last);
  const bool accumulate = accum_ > 1;
  if (last && !accumulate)
    device_sqnorm_.push_back(at::linalg_vector_norm(device_grad, 2, {}, false, at::kFloat).square());
  Wait({unit}, "land");  // the previous micro-batch's accumulation may still read the landing buffer
  at::Tensor landing = units_.LandingBuffer(unit, accumulate);
  auto landed = queue_.Offload(landing, device_grad);
  if (!accumulate) {
    PostWorker(unit).Post(TaskId({unit}), std::move(landed));
    return;
  }
  PostWorker(unit).Post(TaskId({unit}), [this, unit, first, last, landing, landed] {
    landed();
    const int64_t t0 = SteadyNowNs();
    Unit& x = units_[unit];
    if (first) {
      x.grad_sum.copy_(landing);
    } else {
      x.grad_sum.add_(landing);
    }
    if (last) {
      const double norm = at::linalg_vector_norm(x.grad_sum, 2, {}, false, at::kFloat).item<double>();
      x.sqnorm = norm * norm;
    }
    meter_.AddAccumulation(SteadyNowNs() - t0);
  });
}

double UpdateScheduler::GlobalSqNorm() {
  if (accum_ == 1) return at::stack(device_sqnorm_).sum().item<double>();
  {
    ScopedTimer t(meter_.busy().wait_update);
    WaitAll();
    for (size_t u = 0; u < n_units_; ++u) {
      if (!units_[u].resident()) continue;
      const double norm = units_[u].dev_norm.item<double>();
      units_[u].sqnorm = norm * norm;
    }
  }
  double sq = 0;
  for (size_t u = 0; u < n_units_; ++u) sq += units_[u].sqnorm;
  return sq;
}

AdamWStepArgs UpdateScheduler::StepArgs(double lr, float grad_scale, int64_t step) const {
  AdamWStepArgs args;
  args.hp = options_.train.adamw;
  args.hp.lr = lr;
  args.step = step;
  args.grad_scale = grad_scale;
  return args;
}

// On the compute stream, after the backward that produced the gradient and before the next forward that reads
// the weights.
void UpdateScheduler::UpdateResident(size_t unit, const AdamWStepArgs& args) {
  Unit& x = units_[unit];
  const at::Tensor grad = accum_ > 1 ? x.dev_grad_sum : x.dev_grad;
  TORCH_CHECK(grad.defined(), "unit ", unit, " has no gradient to update with");
  const bool write_bf16 = options_.train.compute_dtype == c10::kBFloat16;  // fp32: the weights are the master
  queue_.BeginCompute();
  DeviceUnitAdamW(units_.layout().units[unit], units_.moments(unit), x.dev_master, x.dev_exp_avg, x.dev_exp_avg_sq,
                  grad, write_bf16 ? x.dev_weights : at::Tensor(), args, simd_);
  queue_.EndCompute();
  x.dev_grad = at::Tensor();  // back to the allocator for the next backward
}

void UpdateScheduler::PostUpdate(size_t unit, double lr, float grad_scale, int64_t step) {
  const AdamWStepArgs args = StepArgs(lr, grad_scale, step);
  Unit& x = units_[unit];
  const UnitLayout& layout = units_.layout().units[unit];
  if (x.resident()) return UpdateResident(unit, args);
  const at::Tensor grad = units_.UpdateGradient(unit, accum_ > 1);
  if (Streamed(unit)) {
    // Enqueued by the stream worker after the gradient has landed (its landing task runs first, FIFO); the
    // weights come back into the staging buffer the gradient occupied, as the CPU update writes them.
    const MomentLayout& moments = units_.moments(unit);
    HostUnitUpdate update{moments.kind(), x.master, x.exp_avg, x.exp_avg_sq, grad, x.staging, {}};
    for (size_t i = 0; i < layout.params.size(); ++i) {
      const ParamSpec& spec = layout.params[i];
      update.ranges.push_back({spec.offset, spec.numel, ParamStepArgs(spec, args), moments.params()[i]});
    }
    PostWorker(unit).Post(TaskId({unit}),
                          [this, unit, update = std::move(update)] { queue_.StreamUpdate(unit, update); });
    return;
  }
  StateTier* tier = units_.tier();
  if (x.on_tier()) tier->Schedule(x.tier_index);  // its state starts coming in now, in update order
  PostWorker(unit).Post(TaskId({unit}), [this, unit, args, grad, tier, &layout] {
    Unit& x = units_[unit];
    const int64_t t0 = SteadyNowNs();
    int64_t io_waited = 0;
    const bool q8 = units_.moments(unit).kind() == OptimizerKind::kAdamW8bit;
    if (q8 && !x.on_tier()) {
      HostUnitAdamW8bit(layout, units_.moments(unit),
                        {.begin = 0,
                         .n = layout.numel,
                         .master = x.master.data_ptr<float>(),
                         .exp_avg = x.exp_avg.data_ptr<uint8_t>(),
                         .exp_avg_sq = x.exp_avg_sq.data_ptr<uint8_t>(),
                         .grad = grad,
                         .weights_out = x.staging},
                        args, simd_);
    } else if (!x.on_tier()) {
      HostUnitAdamW(layout,
                    {.begin = 0,
                     .n = layout.numel,
                     .master = x.master.data_ptr<float>(),
                     .exp_avg = x.exp_avg.data_ptr<float>(),
                     .exp_avg_sq = x.exp_avg_sq.data_ptr<float>(),
                     .grad = grad,
                     .weights_out = x.staging},
                    args, simd_);
    } else {
      float* host_master = tier->holds_master() ? nullptr : x.master.data_ptr<float>();
      const int64_t waited_before = tier->io_wait_ns();
      Status st = tier->Update(x.tier_index, [&](const StateTier::Chunk& c) {
        if (q8) {  // the unit's moment buffers whole, one chunk (TierOptionsFor); the master in host memory
          TORCH_CHECK(c.begin == 0 && 4 * c.n >= units_.moments(unit).bytes(), "unit ", unit,
                      "'s 8-bit moments came from the NVMe tier in pieces");
          HostUnitAdamW8bit(layout, units_.moments(unit),
                            {.begin = 0,
                             .n = layout.numel,
                             .master = host_master,
                             .exp_avg = reinterpret_cast<uint8_t*>(c.array[kExpAvg]),
                             .exp_avg_sq = reinterpret_cast<uint8_t*>(c.array[kExpAvgSq]),
                             .grad = grad,
                             .weights_out = x.staging},
                            args, simd_);
          return;
        }
        HostUnitAdamW(layout,
                      {.begin = c.begin,
                       .n = c.n,
                       .master = host_master != nullptr ? host_master + c.begin : c.array[kMasterArray],
                       .exp_avg = c.array[kExpAvg],
                       .exp_avg_sq = c.array[kExpAvgSq],
                       .grad = grad,
                       .weights_out = x.staging},
                      args, simd_);
      });
      io_waited = tier->io_wait_ns() - waited_before;
      meter_.AddNvmeWait(io_waited);
      if (!st.ok()) return Fail(Status(st.code(), "unit " + std::to_string(unit) + "'s update: " + st.message()));
    }
    const int64_t took_ns = SteadyNowNs() - t0;
    meter_.AddWholeUpdate(took_ns - io_waited);  // CPU time; the disk's share is counted as nvme
    meter_.AddUpdateSpan("adamw " + std::to_string(unit), took_ns);
  });
}

// Forward order: the embedding's whole update, each layer's weights-only pass (or whole update when it cannot go
// weights first), the head's whole update; then the layers' whole updates in reverse, the order in which the
// next backward reloads them and lands their gradients. Going weights first, the embedding and the head take the
// weights-only pass too, in chunks of a ring buffer; the head's whole update then comes first of the whole updates
// (its gradient lands first in the next backward) and the embedding's last (its gradient lands last).
bool UpdateScheduler::PostUpdates(double lr, float grad_scale, int64_t step) {
  const size_t head = units_.head_index();
  std::vector<size_t> early;  // the layers of a weights-first round
  if (weights_first_step_) {
    for (size_t u = 0; u < n_units_; ++u)
      if (WeightsFirstEligible(u)) early.push_back(u);
  }
  const bool round = !early.empty();
  const bool embed_first = round && EdgeWeightsFirstEligible(0), head_first = round && EdgeWeightsFirstEligible(head);
  if (round) {
    TORCH_CHECK(ring_, "weights first without its ring (made wherever a step may go weights first)");
    // The last round ends here: its copies have read their buffers (Cancel waits for them; the new round's fills
    // reuse the buffers from ticket 0) and its passes are done (a forward waited for each, or they go on now).
    CancelWeightRing();
    for (size_t u : early) worker_->Wait(TaskId({u, Pass::kWeightsOnly}));
    for (int64_t k = 0; k < edge_chunks_max_; ++k) {
      worker_->Wait(TaskId({0, Pass::kWeightsOnly, k}));
      worker_->Wait(TaskId({head, Pass::kWeightsOnly, k}));
    }
    ring_->Begin(static_cast<int64_t>(early.size()) + (embed_first ? EdgeChunks(0) : 0) +
                 (head_first ? EdgeChunks(head) : 0));
  }
  const AdamWStepArgs args = StepArgs(lr, grad_scale, step);
  int64_t ticket = 0;
  for (size_t u = 0; u < n_units_; ++u) {
    if ((u == 0 && embed_first) || (u == head && head_first)) {
      edge_ticket_[u == head ? 1 : 0] = ticket;
      for (int64_t k = 0; k < EdgeChunks(u); ++k) PostWeightsOnly(u, k, args, ticket++);
    } else if (round && WeightsFirstEligible(u)) {
      layer_ticket_[u - 1] = ticket;
      PostWeightsOnly(u, /*chunk=*/-1, args, ticket++);
    } else {
      PostUpdate(u, lr, grad_scale, step);
    }
  }
  if (head_first) PostUpdate(head, lr, grad_scale, step);
  for (auto u = early.rbegin(); u != early.rend(); ++u) PostUpdate(*u, lr, grad_scale, step);
  if (embed_first) PostUpdate(0, lr, grad_scale, step);
  updates_posted_ = true;
  last_posted_weights_first_ = round;
  return round;
}

void UpdateScheduler::PostWeightsOnly(size_t unit, int64_t chunk, const AdamWStepArgs& args, int64_t ticket) {
  const at::Tensor grad = units_.UpdateGradient(unit, accum_ > 1);
  const UpdateKey key{unit, Pass::kWeightsOnly, chunk};
  const Range range = chunk >= 0 ? EdgeChunk(unit, chunk) : Range{0, units_.layout().units[unit].numel};
  worker_->Post(TaskId(key), [this, key, range, args, grad, ticket] {
    at::Tensor out = ring_->Acquire(ticket);  // may wait for the device copy of ticket - ring size
    const int64_t t0 = SteadyNowNs(), b = range.begin;
    Unit& x = units_[key.unit];
    c10::BFloat16* weights = reinterpret_cast<c10::BFloat16*>(out.data_ptr());
    if (units_.moments(key.unit).kind() == OptimizerKind::kAdamW8bit) {
      HostUnitAdamW8bit(units_.layout().units[key.unit], units_.moments(key.unit),
                        {.begin = b,
                         .n = range.n,
                         .master = x.master.data_ptr<float>() + b,
                         .exp_avg = x.exp_avg.data_ptr<uint8_t>(),
                         .exp_avg_sq = x.exp_avg_sq.data_ptr<uint8_t>(),
                         .grad = grad,
                         .weights_out = x.staging,
                         .weights_only_out = weights},
                        args, simd_);
    } else {
      HostUnitAdamW(units_.layout().units[key.unit],
                    {.begin = b,
                     .n = range.n,
                     .master = x.master.data_ptr<float>() + b,
                     .exp_avg = x.exp_avg.data_ptr<float>() + b,
                     .exp_avg_sq = x.exp_avg_sq.data_ptr<float>() + b,
                     .grad = grad,
                     .weights_out = x.staging,
                     .weights_only_out = weights},
                    args, simd_);
    }
    const int64_t took_ns = SteadyNowNs() - t0;
    meter_.AddWeightsOnly(took_ns);
    meter_.AddUpdateSpan("adamw-" + Name(key), took_ns);
  });
}

bool UpdateScheduler::LoadReady(int64_t layer) const {
  const size_t unit = 1 + layer;
  const UpdateKey key = layer_ticket_[layer] >= 0 ? UpdateKey{unit, Pass::kWeightsOnly} : UpdateKey{unit};
  return WorkerFor(key).Idle(TaskId(key));
}

void UpdateScheduler::LoadLayer(int64_t layer, const LayerCopy& copy) {
  const size_t unit = 1 + layer;
  if (const int64_t ticket = layer_ticket_[layer]; ticket >= 0) {
    // The weights-only pass wrote the weights into the ring; the whole update still owns the staging buffer.
    Wait({unit, Pass::kWeightsOnly}, "load");
    at::Tensor weights = ring_->Buffer(ticket).narrow(0, 0, units_.layout().units[unit].numel);
    ring_->Consumed(ticket, copy(weights, -1));
    layer_ticket_[layer] = -1;
    ++ring_loads_;
    return;
  }
  Wait({unit}, "load");
  // A streamed update was enqueued by now (its worker is idle for the unit); the copy waits for its write-back.
  copy(units_[unit].staging, on_stream_worker_[unit] ? static_cast<int64_t>(unit) : -1);
}

// The embedding is needed first and the head last: each waits only for its own update, so the next step's
// forward starts as soon as the embedding's update is done rather than after every unit's.
void UpdateScheduler::LoadEdge(bool head, const EdgeCopy& copy) {
  const size_t unit = head ? units_.head_index() : 0;
  int64_t& first_ticket = edge_ticket_[head ? 1 : 0];
  if (first_ticket < 0) {
    Wait({unit}, "load");
    copy(0, units_.layout().units[unit].numel, units_[unit].staging);
    return;
  }
  for (int64_t k = 0; k < EdgeChunks(unit); ++k) {
    const Range c = EdgeChunk(unit, k);
    Wait({unit, Pass::kWeightsOnly, k}, "load");
    ring_->Consumed(first_ticket + k, copy(c.begin, c.n, ring_->Buffer(first_ticket + k).narrow(0, 0, c.n)));
    ++edge_ring_chunks_;
  }
  first_ticket = -1;
}

void UpdateScheduler::CancelWeightRing() {
  if (!ring_) return;
  ring_->Cancel();
  std::fill(layer_ticket_.begin(), layer_ticket_.end(), -1);
  edge_ticket_[0] = edge_ticket_[1] = -1;
}

void UpdateScheduler::WaitAll() {
  updates_posted_ = false;
  CancelWeightRing();  // a pending weights-only pass may be waiting for a forward that will not come first
  worker_->WaitAll();
  if (stream_worker_) stream_worker_->WaitAll();
}

void UpdateScheduler::Fail(Status error) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (error_.ok()) error_ = std::move(error);
}

void UpdateScheduler::TakeWorkerErrors() {
  for (UpdateWorker* w : {worker_.get(), stream_worker_.get()}) {
    if (w == nullptr) continue;
    const std::string error = w->TakeError();
    if (!error.empty()) Fail(Internal("optimizer update failed: " + error));
  }
}

Status UpdateScheduler::status() {
  TakeWorkerErrors();
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

Status UpdateScheduler::Sync() {
  WaitAll();
  try {
    queue_.SyncStreamedUpdates();
  } catch (const std::exception& e) {
    Fail(Internal(std::string("streamed update failed: ") + e.what()));
  }
  SLIDE_RETURN_IF_ERROR(status());
  return units_.tier() ? units_.tier()->Flush() : Status::Ok();
}

}  // namespace slide
