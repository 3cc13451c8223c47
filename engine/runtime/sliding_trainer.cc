#include "engine/runtime/sliding_trainer.h"
#include "engine/runtime/torch_status.h"
#include "engine/runtime/trainer_resolver.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <utility>

#include "engine/memory/host_array.h"
#include "engine/optim/tensor_adamw.h"
#include "engine/runtime/device_info.h"

namespace slide {
namespace {

class ScopedTimer {
 public:
  explicit ScopedTimer(double& sink) : sink_(sink), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { sink_ += Elapsed(); }
  double Elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  double& sink_;
  std::chrono::steady_clock::time_point t0_;
};

// A parameter's step arguments: the unit's, without weight decay where the parameter takes none (norms, biases).
AdamWStepArgs ParamArgs(const ParamSpec& spec, const AdamWStepArgs& unit_args) {
  AdamWStepArgs a = unit_args;
  if (!spec.weight_decay) a.hp.weight_decay = 0;
  return a;
}

// Cancels the weights-first ring when a forward fails part way: passes waiting for loads that will not come go on,
// and a later step or evaluation loads from staging instead of waiting behind them (or reading a stale round).
class CancelRingOnThrow {
 public:
  explicit CancelRingOnThrow(std::function<void()> cancel)
      : cancel_(std::move(cancel)), exceptions_(std::uncaught_exceptions()) {}
  ~CancelRingOnThrow() {
    if (std::uncaught_exceptions() <= exceptions_) return;
    try {
      cancel_();
    } catch (...) {  // already unwinding with the step's error
    }
  }

 private:
  std::function<void()> cancel_;
  int exceptions_;
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

double ResourceBusy::MaxResource() const { return std::max({compute, h2d, d2h, cpu_update, nvme, device_update}); }

double ResourceBusy::OverlapRatio() const { return MaxResource() > 0 ? step / MaxResource() : 0; }

const char* ResourceBusy::Bound() const {
  if (wait_update > 0.2 * step) return nvme > cpu_update ? "nvme" : "update_dependency";
  const char* name = "gpu_compute";
  double most = compute;
  if (h2d > most) name = "h2d", most = h2d;
  if (d2h > most) name = "d2h", most = d2h;
  if (cpu_update > most) name = "cpu_update", most = cpu_update;
  if (nvme > most) name = "nvme", most = nvme;
  if (device_update > most) name = "device_update";
  return name;
}

SlidingTrainer::SlidingTrainer(ModelConfig cfg, const ModelParams& master_fp32, SlidingOptions options,
                               std::unique_ptr<StateTier> tier)
    : SlidingTrainer(std::move(cfg), master_fp32.To(at::TensorOptions().dtype(at::kFloat)), std::move(options),
                     std::move(tier)) {}

SlidingTrainer::SlidingTrainer(ModelConfig cfg, ModelParams&& master_fp32, SlidingOptions options,
                               std::unique_ptr<StateTier> tier)
    : cfg_(std::move(cfg)),
      layout_(master_fp32.layout),
      opts_(std::move(options)),
      simd_(DetectSimdLevel()),
      tier_(std::move(tier)) {
  bool adoptable = true;
  for (const auto& t : master_fp32.units)
    adoptable = adoptable && t.scalar_type() == at::kFloat && t.is_cpu() && t.is_contiguous();
  master_ = adoptable ? std::move(master_fp32) : master_fp32.To(at::TensorOptions().dtype(at::kFloat));
  Init();
}

StatusOr<std::unique_ptr<StateTier>> SlidingTrainer::OpenTier(const ModelLayout& layout,
                                                              const SlidingOptions& options) {
  if (options.nvme.mode == TierMode::kNone) return std::unique_ptr<StateTier>();
  SLIDE_ASSIGN_OR_RETURN(const std::vector<int64_t> index, TierUnitIndex(layout.num_layers(), options.nvme));
  std::vector<int64_t> numel;
  for (size_t u = 0; u < layout.units.size(); ++u)
    if (index[u] >= 0) numel.push_back(layout.units[u].numel);
  return StateTier::Open(options.nvme, numel);
}

StatusOr<std::unique_ptr<SlidingTrainer>> SlidingTrainer::Create(ModelConfig cfg, ModelParams&& master_fp32,
                                                                 const ResolvedTrainer& resolved) {
  SLIDE_ASSIGN_OR_RETURN(std::unique_ptr<StateTier> tier, OpenTier(master_fp32.layout, resolved.options));
  auto trainer =
      std::make_unique<SlidingTrainer>(std::move(cfg), std::move(master_fp32), resolved.options, std::move(tier));
  trainer->planned_tokens_ = resolved.planned_tokens;
  return trainer;
}

StatusOr<std::unique_ptr<SlidingTrainer>> SlidingTrainer::Create(ModelConfig cfg, ModelParams&& master_fp32,
                                                                 SlidingOptions options, PlanRequest budget,
                                                                 MemoryPlan* plan_out) {
  SLIDE_ASSIGN_OR_RETURN(ResolvedTrainer resolved, ResolveTrainer(cfg, std::move(options), std::move(budget)));
  if (plan_out != nullptr) *plan_out = resolved.plan;
  return Create(std::move(cfg), std::move(master_fp32), resolved);
}

void SlidingTrainer::Init() {
  const auto dtype = opts_.train.compute_dtype;
  TORCH_CHECK(dtype == c10::kBFloat16 || dtype == c10::kFloat, "sliding trainer computes in bf16 or fp32");
  TORCH_CHECK(opts_.window >= 1, "window must be at least 1 slot");
  on_cuda_ = opts_.train.device.is_cuda();
  device_opts_ = at::TensorOptions().dtype(dtype).device(opts_.train.device);
  if (on_cuda_) LimitDeviceMemory(opts_.device_budget_bytes);
  // Slots: the window's layers, the embedding, the head, and two buffers parked layer inputs come back into.
  queue_ = std::make_unique<DeviceQueue>(opts_.train.device, static_cast<int>(opts_.window) + 4);

  if (opts_.nvme.mode != TierMode::kNone) {
    auto index = TierUnitIndex(layout_.num_layers(), opts_.nvme);
    TORCH_CHECK(index.ok(), index.status().ToString());
    tier_index_ = std::move(index).value();
    if (!tier_) {
      auto tier = OpenTier(layout_, opts_);
      TORCH_CHECK(tier.ok(), tier.status().ToString());
      tier_ = std::move(tier).value();
    }
  }
  TORCH_CHECK(!tier_ || static_cast<int64_t>(tier_->units()) ==
                            std::count_if(tier_index_.begin(), tier_index_.end(), [](int64_t i) { return i >= 0; }),
              "the NVMe tier given was opened for other units than options.nvme names");
  TORCH_CHECK(opts_.resident_layers >= 0 && opts_.resident_layers <= layout_.num_layers(),
              "resident layers must be between 0 and the layer count");
  TORCH_CHECK(!tier_ || opts_.resident_layers == 0, "resident layers cannot be combined with the NVMe tier");
  auto master_on_disk = [&](size_t u) { return OnTier(u) && tier_->holds_master(); };
  const size_t n_units = layout_.units.size();

  // Streamed updates: every k-th host layer by the share; their state lives in page-locked buffers.
  const double share = opts_.device_update_share;
  TORCH_CHECK(share >= 0 && share <= 1, "device_update_share must be in [0, 1]");
  if (share > 0) {
    TORCH_CHECK(dtype == c10::kBFloat16, "streamed updates need bf16 compute");
    TORCH_CHECK(!tier_, "streamed updates cannot be combined with the NVMe tier");
    streamed_.assign(n_units, false);
    int64_t host_layers = 0;
    for (int64_t i = 0; i < layout_.num_layers(); ++i) {
      if (Resident(1 + i)) continue;
      // The share of the first m host layers is floor(m * share): this layer streams when that count steps up.
      streamed_[1 + i] = std::floor((host_layers + 1) * share) > std::floor(host_layers * share);
      ++host_layers;
    }
    queue_->EnableStreamedUpdates(opts_.device_update_chunk, 3, n_units, simd_);
    stream_worker_ = std::make_unique<UpdateWorker>(n_units);
  }
  auto host_zeros = [&](size_t u) {
    const int64_t numel = layout_.units[u].numel;
    return StreamCapable(u) ? queue_->AllocateHost(numel, at::kFloat).zero_()
                            : HostArray(numel, at::kFloat, opts_.host_huge_pages);
  };
  unit_sqnorm_.assign(n_units, 0.0);
  for (auto* v :
       {&dev_weights_, &dev_master_, &dev_exp_avg_, &dev_exp_avg_sq_, &dev_grad_, &dev_grad_accum_, &dev_norm_})
    v->resize(n_units);
  for (size_t u = 0; u < n_units; ++u) {
    if (Resident(u)) {  // the state moves to the device; the host keeps nothing of this unit
      const auto dev_f32 = at::TensorOptions().dtype(at::kFloat).device(opts_.train.device);
      dev_master_[u] = master_.units[u].to(dev_f32);
      dev_exp_avg_[u] = at::zeros({layout_.units[u].numel}, dev_f32);
      dev_exp_avg_sq_[u] = at::zeros({layout_.units[u].numel}, dev_f32);
      dev_weights_[u] = dtype == c10::kFloat ? dev_master_[u] : dev_master_[u].to(dtype);  // RNE, as AdamW writes
      master_.units[u] = at::Tensor();
      staging_.emplace_back();
      continue;
    }
    // The loaded master moves, one unit at a time, into a page-locked buffer (streamed) or its own mapping (huge
    // pages unless turned off).
    if (StreamCapable(u)) {
      at::Tensor master = queue_->AllocateHost(layout_.units[u].numel, at::kFloat);
      master_.units[u] = master.copy_(master_.units[u]);
    } else if (!master_on_disk(u)) {
      TORCH_CHECK(master_.units[u].is_contiguous() && master_.units[u].numel() == layout_.units[u].numel, "unit ", u,
                  "'s master weights do not match its layout");
      master_.units[u] = HostArray(layout_.units[u].numel, at::kFloat, opts_.host_huge_pages,
                                   master_.units[u].const_data_ptr<float>());
    }
    if (dtype == c10::kFloat && !on_cuda_ && !master_on_disk(u)) {
      staging_.push_back(master_.units[u]);  // fp32 on the host: the master is what the forward loads
    } else {
      staging_.push_back(queue_->AllocateHost(layout_.units[u].numel, dtype));
      staging_.back().copy_(master_.units[u]);
    }
    if (master_on_disk(u)) {  // unit by unit, so the host never holds the fp32 model and all its staging at once
      Status st = tier_->WriteArray(tier_index_[u], kMasterArray, master_.units[u].data_ptr<float>());
      TORCH_CHECK(st.ok(), "writing the master weights to the NVMe tier: ", st.ToString());
      master_.units[u] = at::Tensor();
    }
  }
  // The moments last: by now the masters that moved to the device or the tier are gone, so the host's peak during
  // start-up is the plan's total rather than that plus those masters (10 GiB at 13B with 24 layers tiered).
  exp_avg_.layout = exp_avg_sq_.layout = layout_;
  for (size_t u = 0; u < n_units; ++u) {  // in host memory unless on the device or on the tier
    const bool on_host = !Resident(u) && !OnTier(u);
    exp_avg_.units.push_back(on_host ? host_zeros(u) : at::Tensor());
    exp_avg_sq_.units.push_back(on_host ? host_zeros(u) : at::Tensor());
  }

  int64_t slot_numel = 0;
  for (int64_t i = 0; i < layout_.num_layers(); ++i) slot_numel = std::max(slot_numel, layout_.layer(i).numel);
  for (int64_t w = 0; w < opts_.window; ++w) slots_.push_back(at::empty({slot_numel}, device_opts_));
  slot_layer_.assign(opts_.window, -1);
  slot_version_.assign(opts_.window, -1);
  embed_dev_ = at::empty({layout_.embed().numel}, device_opts_);
  head_dev_ = at::empty({layout_.head().numel}, device_opts_);
  // Weights first sends the embedding and the head through the ring in chunks of a ring buffer (a layer's size).
  edge_chunks_max_ = (std::max(layout_.embed().numel, layout_.head().numel) + slot_numel - 1) / slot_numel;
  // Each unit's whole update, each unit's weights-only pass, each edge chunk's weights-only pass.
  worker_ = std::make_unique<UpdateWorker>(2 * n_units + 2 * edge_chunks_max_);
  on_stream_worker_.assign(2 * n_units + 2 * edge_chunks_max_, false);
  ring_ticket_.assign(layout_.num_layers(), -1);
  // The weights-first ring is page-locked here, where the plan counted it, rather than in the first step that goes
  // weights first (pinning ~1.3 GiB at 8B takes a good part of a second of that step).
  bool may_go_weights_first = false;
  int64_t cpu_numel = 0, streamed_numel = 0;
  for (size_t u = 0; u < n_units; ++u) {
    may_go_weights_first = may_go_weights_first || WeightsFirstEligible(u);  // streamed layers are eligible here
    if (!Resident(u) && !OnTier(u)) (StreamCapable(u) ? streamed_numel : cpu_numel) += layout_.units[u].numel;
  }
  if (cpu_numel > 0) streamed_per_cpu_element_ = double(streamed_numel) / double(cpu_numel);
  if (WeightsFirstAllowed(opts_) && may_go_weights_first && dtype == c10::kBFloat16 && opts_.train.max_grad_norm > 0)
    MakeWeightRing();
}

void SlidingTrainer::MakeWeightRing() {
  std::vector<at::Tensor> buffers;
  for (int64_t r = 0; r <= opts_.window; ++r)
    buffers.push_back(queue_->AllocateHost(slots_.front().numel(), opts_.train.compute_dtype));
  weight_ring_ = std::make_unique<WeightRing>(std::move(buffers));
}

void SlidingTrainer::WaitAllWorkers() {
  updates_posted_ = false;
  CancelWeightRing();  // a pending weights-only pass may be waiting for a forward that will not come first
  worker_->WaitAll();
  if (stream_worker_) stream_worker_->WaitAll();
}

SlidingTrainer::~SlidingTrainer() {
  WaitAllWorkers();
  try {
    queue_->SyncStreamedUpdates();
  } catch (...) {  // a failed device: destructors must not throw (the job already has the error)
  }
}

// Slots 0..window-1 hold layers (layer i in slot i % window); slot `window` the embedding, window+1 the head.
at::Tensor SlidingTrainer::SlotView(int64_t layer) {
  if (Resident(1 + layer)) return dev_weights_[1 + layer];
  return slots_[layer % opts_.window].narrow(0, 0, layout_.layer(layer).numel);
}

void SlidingTrainer::WaitForUnit(size_t unit, const char* why, const std::string& what) {
  UpdateWorker& worker = WorkerFor(unit);
  if (worker.Idle(unit)) return;
  const double t0 = TraceNow();
  {
    ScopedTimer t(busy_.wait_update);
    worker.Wait(unit);
  }
  if (opts_.trace) {
    std::lock_guard<std::mutex> lock(trace_mu_);
    pending_trace_.push_back(
        {"engine.wait", std::string(why) + " " + (what.empty() ? std::to_string(unit) : what), t0, TraceNow()});
  }
}

bool SlidingTrainer::LoadReady(int64_t layer) {
  const size_t unit = 1 + layer;
  return ring_ticket_[layer] >= 0 ? worker_->Idle(EarlyUnit(unit)) : WorkerFor(unit).Idle(unit);
}

void SlidingTrainer::Prefetch(int64_t layer) {
  if (LoadReady(layer)) EnsureLoaded(layer);
}

void SlidingTrainer::EnsureLoaded(int64_t layer) {
  if (Resident(1 + layer)) return;  // always there, updated in place
  const int64_t w = layer % opts_.window;
  if (slot_layer_[w] == layer && slot_version_[w] == weights_version_) return;
  if (const int64_t ticket = ring_ticket_[layer]; ticket >= 0) {
    // The weights-only pass wrote the weights into the ring; the whole update still owns the staging buffer.
    WaitForUnit(EarlyUnit(1 + layer), "load", WeightsPassName(1 + layer, -1));
    at::Tensor weights = weight_ring_->Buffer(ticket).narrow(0, 0, layout_.layer(layer).numel);
    weight_ring_->Consumed(ticket, queue_->LoadSlot(static_cast<int>(w), SlotView(layer), weights));
    ring_ticket_[layer] = -1;
    ++ring_loads_;
  } else {
    WaitForUnit(1 + layer, "load");
    // A streamed update was enqueued by now (its worker is idle for the unit); the copy waits for its write-back.
    queue_->LoadSlot(static_cast<int>(w), SlotView(layer), staging_[1 + layer],
                     on_stream_worker_[1 + layer] ? static_cast<int64_t>(1 + layer) : -1);
  }
  slot_layer_[w] = layer;
  slot_version_[w] = weights_version_;
  ++slot_loads_;
}

// The embedding is needed first and the head last: each waits only for its own update, so the next step's
// forward starts as soon as the embedding's update is done rather than after every unit's.
void SlidingTrainer::LoadEdgeUnit(bool head) {
  int64_t& version = head ? head_version_ : embed_version_;
  if (version == weights_version_) return;
  const size_t unit = head ? layout_.units.size() - 1 : 0;
  const int slot = static_cast<int>(opts_.window) + (head ? 1 : 0);
  at::Tensor& dst = head ? head_dev_ : embed_dev_;
  int64_t& first_ticket = edge_ticket_[head ? 1 : 0];
  if (first_ticket >= 0) {  // weights first: chunk by chunk from the ring, each copy issued as its pass ends
    for (int64_t k = 0; k < EdgeChunks(unit); ++k) {
      const Range c = EdgeChunk(unit, k);
      WaitForUnit(EdgeChunkUnit(head, k), "load", WeightsPassName(unit, k));
      weight_ring_->Consumed(first_ticket + k,
                             queue_->LoadSlot(slot, dst.narrow(0, c.begin, c.n),
                                              weight_ring_->Buffer(first_ticket + k).narrow(0, 0, c.n)));
      ++edge_ring_chunks_;
    }
    first_ticket = -1;
  } else {
    WaitForUnit(unit, "load");
    queue_->LoadSlot(slot, dst, staging_[unit]);
  }
  version = weights_version_;
  ++slot_loads_;
}

const RopeTables& SlidingTrainer::Rope(int64_t seq_len) {
  if (seq_len != rope_seq_len_) {
    rope_ = BuildRopeTables(cfg_, seq_len, device_opts_);
    rope_seq_len_ = seq_len;
  }
  return rope_;
}

void SlidingTrainer::WaitForUpdates() {
  WaitAllWorkers();
  queue_->SyncStreamedUpdates();
}

// The layer's input goes to its own host buffer (page-locked, exactly its size: LibTorch's pinned allocator would
// round 384 MiB up to 512) on the D2H stream while the forward goes on.
at::Tensor SlidingTrainer::Park(const at::Tensor& x, int64_t index) {
  if (!opts_.checkpoints_on_host) return x;
  if (parked_host_.size() <= static_cast<size_t>(index)) parked_host_.resize(index + 1);
  at::Tensor& flat = parked_host_[index];
  if (!flat.defined() || flat.numel() < x.numel()) {
    if (flat.defined()) retired_host_.push_back(flat);  // page-locked until the queue goes: keep it alive
    flat = queue_->AllocateHost(x.numel(), x.scalar_type());
  }
  at::Tensor host = flat.narrow(0, 0, x.numel()).view(x.sizes());
  queue_->Park(index, host, x);
  return host;
}

// Layer `layer`'s parked input back on the device, into buffer layer % 2 (the one the layer after it released),
// on the H2D stream; the layer's compute waits for it through UseSlot(ParkedSlot(layer)).
void SlidingTrainer::Unpark(int64_t layer, const at::Tensor& parked) {
  at::Tensor& flat = parked_dev_[layer % 2];
  if (!flat.defined() || flat.numel() < parked.numel()) {
    flat = at::empty({parked.numel()}, device_opts_.dtype(parked.scalar_type()));
    queue_->ReleaseSlot(ParkedSlot(layer));  // the copy waits for compute still using this memory's last owner
  }
  queue_->Unpark(layer, ParkedSlot(layer), ParkedOnDevice(layer, parked), parked);
}

int64_t SlidingTrainer::parked_bytes() const {
  int64_t bytes = 0;
  for (const auto& t : parked_host_) bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return bytes;
}

at::Tensor SlidingTrainer::ParkedOnDevice(int64_t layer, const at::Tensor& parked) {
  return parked_dev_[layer % 2].narrow(0, 0, parked.numel()).view(parked.sizes());
}

// With bf16 compute and no accumulation a unit's gradient lands in its own staging buffer: the staging
// weights are not read again until the update has overwritten them with the new weights (AdamW reads the
// gradient and writes the bf16 weight element by element in place). Saves 2 bytes per parameter.
at::Tensor SlidingTrainer::LandingBuffer(size_t unit) {
  const bool in_staging = accum_ == 1 && !staging_[unit].is_same(master_.units[unit]);
  if (in_staging) return staging_[unit];
  if (grad_host_.empty()) {
    for (size_t u = 0; u < layout_.units.size(); ++u)
      grad_host_.push_back(Resident(u) ? at::Tensor()
                                       : queue_->AllocateHost(layout_.units[u].numel, opts_.train.compute_dtype));
  }
  return grad_host_[unit];
}

// A resident unit's gradient stays where it was computed: held for the update (or summed in fp32 across
// micro-batches). The norm uses the same operations as a returned gradient's, so the global norm is unchanged.
void SlidingTrainer::LandResidentGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last) {
  if (accum_ == 1) {
    if (last) device_sqnorm_.push_back(at::linalg_vector_norm(device_grad, 2, {}, false, at::kFloat).square());
    dev_grad_[unit] = device_grad;
    return;
  }
  if (!dev_grad_accum_[unit].defined())
    dev_grad_accum_[unit] = at::empty({layout_.units[unit].numel}, device_grad.options().dtype(at::kFloat));
  if (first) {
    dev_grad_accum_[unit].copy_(device_grad);
  } else {
    dev_grad_accum_[unit].add_(device_grad);
  }
  if (last) dev_norm_[unit] = at::linalg_vector_norm(dev_grad_accum_[unit], 2, {}, false, at::kFloat);
}

void SlidingTrainer::LandGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last) {
  if (Resident(unit)) return LandResidentGrad(unit, device_grad, first, last);
  const bool accumulate = accum_ > 1;
  if (last && !accumulate)
    device_sqnorm_.push_back(at::linalg_vector_norm(device_grad, 2, {}, false, at::kFloat).square());
  WaitForUnit(unit, "land");  // the previous micro-batch's accumulation may still read the landing buffer
  at::Tensor landing = LandingBuffer(unit);
  auto landed = queue_->Offload(landing, device_grad);
  if (!accumulate) {
    PostWorker(unit).Post(unit, std::move(landed));
    return;
  }
  PostWorker(unit).Post(unit, [this, unit, first, last, landing, landed] {
    landed();
    const int64_t t0 = NowNs();
    if (first) {
      grad_accum_[unit].copy_(landing);
    } else {
      grad_accum_[unit].add_(landing);
    }
    if (last) {
      const double norm = at::linalg_vector_norm(grad_accum_[unit], 2, {}, false, at::kFloat).item<double>();
      unit_sqnorm_[unit] = norm * norm;
    }
    update_ns_ += NowNs() - t0;
  });
}

void SlidingTrainer::UpdateRange(size_t unit, int64_t begin, int64_t n, float* master, float* exp_avg,
                                 float* exp_avg_sq, const at::Tensor& grad, const AdamWStepArgs& args,
                                 c10::BFloat16* weights_only_out) {
  const bool f32_grad = grad.scalar_type() == at::kFloat;
  const bool write_bf16 = opts_.train.compute_dtype == c10::kBFloat16;
  const int64_t end = begin + n;
  for (const auto& spec : layout_.units[unit].params) {
    const int64_t lo = std::max(begin, spec.offset), hi = std::min(end, spec.offset + spec.numel);
    if (lo >= hi) continue;
    const AdamWStepArgs a = ParamArgs(spec, args);
    AdamWSpan span;
    span.param = master + (lo - begin);
    span.exp_avg = exp_avg + (lo - begin);
    span.exp_avg_sq = exp_avg_sq + (lo - begin);
    if (f32_grad) {
      span.grad_f32 = grad.data_ptr<float>() + lo;
    } else {
      span.grad_bf16 = reinterpret_cast<const c10::BFloat16*>(grad.data_ptr()) + lo;
    }
    if (write_bf16) span.out_bf16 = reinterpret_cast<c10::BFloat16*>(staging_[unit].data_ptr()) + lo;
    if (weights_only_out != nullptr) {
      span.out_bf16 = weights_only_out + (lo - begin);
      span.weights_only = true;
    }
    span.n = hi - lo;
    CpuAdamW(span, a, simd_);
  }
  if (weights_only_out != nullptr) return;
  // fp32 compute with its own staging (CUDA, or a master on disk): the forward loads a copy of the master.
  const bool copy_f32 = !write_bf16 && staging_[unit].data_ptr<float>() + begin != master;
  if (copy_f32) std::memcpy(staging_[unit].data_ptr<float>() + begin, master, n * sizeof(float));
}

// On the compute stream, after the backward that produced the gradient and before the next forward that reads
// the weights; each parameter with its own decay, as UpdateRange does.
void SlidingTrainer::UpdateResident(size_t unit, const AdamWStepArgs& args) {
  const at::Tensor grad = accum_ > 1 ? dev_grad_accum_[unit] : dev_grad_[unit];
  TORCH_CHECK(grad.defined(), "unit ", unit, " has no gradient to update with");
  const bool write_bf16 = opts_.train.compute_dtype == c10::kBFloat16;  // fp32: the weights are the master
  queue_->BeginCompute();
  for (const auto& spec : layout_.units[unit].params) {
    const AdamWStepArgs a = ParamArgs(spec, args);
    auto part = [&](const at::Tensor& t) { return t.narrow(0, spec.offset, spec.numel); };
    TensorAdamW(part(dev_master_[unit]), part(dev_exp_avg_[unit]), part(dev_exp_avg_sq_[unit]), part(grad),
                write_bf16 ? part(dev_weights_[unit]) : at::Tensor(), a, simd_);
  }
  queue_->EndCompute();
  dev_grad_[unit] = at::Tensor();  // back to the allocator for the next backward
}

AdamWStepArgs SlidingTrainer::UnitArgs(double lr, float grad_scale, int64_t step) const {
  AdamWStepArgs args;
  args.hp = opts_.train.adamw;
  args.hp.lr = lr;
  args.step = step;
  args.grad_scale = grad_scale;
  return args;
}

void SlidingTrainer::TraceUpdate(const std::string& name, int64_t took_ns) {
  if (!opts_.trace) return;
  std::lock_guard<std::mutex> lock(trace_mu_);
  const double now = TraceNow();
  pending_trace_.push_back({"update", name, now - took_ns / 1e9, now});
}

void SlidingTrainer::PostUpdate(size_t unit, double lr, float grad_scale, int64_t step) {
  const AdamWStepArgs unit_args = UnitArgs(lr, grad_scale, step);
  if (Resident(unit)) return UpdateResident(unit, unit_args);
  if (Streamed(unit)) {
    // Enqueued by the stream worker after the gradient has landed (its landing task runs first, FIFO); the
    // weights come back into the staging buffer the gradient occupied, as the CPU update writes them.
    HostUnitUpdate update;
    update.master = master_.units[unit];
    update.exp_avg = exp_avg_.units[unit];
    update.exp_avg_sq = exp_avg_sq_.units[unit];
    update.grad = accum_ > 1 ? grad_accum_[unit] : LandingBuffer(unit);
    update.out = staging_[unit];
    for (const auto& spec : layout_.units[unit].params) {
      update.ranges.push_back({spec.offset, spec.numel, ParamArgs(spec, unit_args)});
    }
    PostWorker(unit).Post(unit, [this, unit, update = std::move(update)] { queue_->StreamUpdate(unit, update); });
    return;
  }
  const at::Tensor grad = accum_ > 1 ? grad_accum_[unit] : LandingBuffer(unit);
  if (OnTier(unit)) tier_->Schedule(tier_index_[unit]);  // its state starts coming in now, in update order
  PostWorker(unit).Post(unit, [this, unit, args = unit_args, grad] {
    const int64_t t0 = NowNs();
    int64_t io_waited = 0;
    if (!OnTier(unit)) {
      UpdateRange(unit, 0, layout_.units[unit].numel, master_.units[unit].data_ptr<float>(),
                  exp_avg_.units[unit].data_ptr<float>(), exp_avg_sq_.units[unit].data_ptr<float>(), grad, args);
    } else {
      float* host_master = tier_->holds_master() ? nullptr : master_.units[unit].data_ptr<float>();
      const int64_t waited_before = tier_->io_wait_ns();
      Status st = tier_->Update(tier_index_[unit], [&](const StateTier::Chunk& c) {
        float* m = host_master != nullptr ? host_master + c.begin : c.array[kMasterArray];
        UpdateRange(unit, c.begin, c.n, m, c.array[kExpAvg], c.array[kExpAvgSq], grad, args);
      });
      io_waited = tier_->io_wait_ns() - waited_before;
      nvme_wait_ns_ += io_waited;
      if (!st.ok()) throw std::runtime_error("unit " + std::to_string(unit) + ": " + st.ToString());
    }
    const int64_t took_ns = NowNs() - t0;
    update_ns_ += took_ns - io_waited;  // CPU time; the disk's share is counted as nvme
    whole_adamw_ns_ += took_ns - io_waited;
    TraceUpdate("adamw " + std::to_string(unit), took_ns);
  });
}

// A weights-only pass in traces: "weights U" for a layer, "weights U.K" for chunk K of an edge unit.
std::string SlidingTrainer::WeightsPassName(size_t unit, int64_t chunk) {
  return "weights " + std::to_string(unit) + (chunk >= 0 ? "." + std::to_string(chunk) : "");
}

bool SlidingTrainer::schedule_settled() const { return !PolicyChooses() || weights_first_policy_.Settled(); }

void SlidingTrainer::set_weights_first(WeightsFirst mode) {
  TORCH_CHECK(mode != WeightsFirst::kOn || weight_ring_,
              "weights first needs a trainer made with it allowed: its ring is made there");
  opts_.weights_first = mode;
}

UpdateWorker& SlidingTrainer::PostWorker(size_t unit) {
  on_stream_worker_[unit] = Streamed(unit);
  return WorkerFor(unit);
}

int64_t SlidingTrainer::streamed_units() const { return std::count(streamed_.begin(), streamed_.end(), true); }

// Held in host memory (not resident or on the NVMe tier; a streamed unit's state is too): where the weights-only
// pass can run.
bool SlidingTrainer::HostHeld(size_t unit) const { return !Resident(unit) && !OnTier(unit); }

bool SlidingTrainer::WeightsFirstEligible(size_t unit) const {
  return unit >= 1 && unit <= static_cast<size_t>(layout_.num_layers()) && HostHeld(unit);
}

bool SlidingTrainer::EdgeWeightsFirstEligible(size_t unit) const {
  return (unit == 0 || unit + 1 == layout_.units.size()) && HostHeld(unit);
}

int64_t SlidingTrainer::EdgeChunks(size_t unit) const {
  const int64_t size = weight_ring_->Buffer(0).numel();
  return (layout_.units[unit].numel + size - 1) / size;
}

SlidingTrainer::Range SlidingTrainer::EdgeChunk(size_t unit, int64_t chunk) const {
  const int64_t size = weight_ring_->Buffer(0).numel(), begin = chunk * size;
  return {begin, std::min(size, layout_.units[unit].numel - begin)};
}

// Off where the weights cannot go first (no ring: fp32 compute, no clipping, no eligible layer, or not allowed when
// the trainer was made) and, automatically, on the CPU device (the passes would take the cores the compute runs on);
// on when the options say so; otherwise the policy's choice, made by the steps' measured times.
bool SlidingTrainer::ChooseWeightsFirst() {
  if (!weight_ring_ || opts_.weights_first == WeightsFirst::kOff) return false;
  return opts_.weights_first == WeightsFirst::kOn || (PolicyChooses() && weights_first_policy_.Choose());
}

// The ring exists only with bf16 compute, clipping and a layer that can go weights first.
bool SlidingTrainer::PolicyChooses() const {
  return weight_ring_ && opts_.weights_first == WeightsFirst::kAuto && on_cuda_;
}

// Forward order: the embedding's whole update, each layer's weights-only pass (or whole update when it cannot go
// weights first), the head's whole update; then the layers' whole updates in reverse, the order in which the
// next backward reloads them and lands their gradients. Going weights first, the embedding and the head take the
// weights-only pass too, in chunks of a ring buffer; the head's whole update then comes first of the whole updates
// (its gradient lands first in the next backward) and the embedding's last (its gradient lands last).
void SlidingTrainer::PostUpdates(double lr, float grad_scale) {
  const size_t n_units = layout_.units.size(), head = n_units - 1;
  std::vector<size_t> early;  // the layers of a weights-first round
  if (weights_first_step_) {
    for (size_t u = 0; u < n_units; ++u)
      if (WeightsFirstEligible(u)) early.push_back(u);
  }
  const bool round = !early.empty();
  const bool embed_first = round && EdgeWeightsFirstEligible(0), head_first = round && EdgeWeightsFirstEligible(head);
  if (round) {
    TORCH_CHECK(weight_ring_, "weights first without its ring (Init makes it wherever a step may go weights first)");
    // The last round ends here: its copies have read their buffers (Cancel waits for them; the new round's fills
    // reuse the buffers from ticket 0) and its passes are done (a forward waited for each, or they go on now).
    CancelWeightRing();
    for (size_t u : early) worker_->Wait(EarlyUnit(u));
    for (int64_t k = 0; k < edge_chunks_max_; ++k) {
      worker_->Wait(EdgeChunkUnit(false, k));
      worker_->Wait(EdgeChunkUnit(true, k));
    }
    weight_ring_->Begin(static_cast<int64_t>(early.size()) + (embed_first ? EdgeChunks(0) : 0) +
                        (head_first ? EdgeChunks(head) : 0));
  }
  const AdamWStepArgs args = UnitArgs(lr, grad_scale, step_ + 1);
  int64_t ticket = 0;
  for (size_t u = 0; u < n_units; ++u) {
    if ((u == 0 && embed_first) || (u == head && head_first)) {
      edge_ticket_[u == head ? 1 : 0] = ticket;
      for (int64_t k = 0; k < EdgeChunks(u); ++k) PostWeightsOnly(u, k, args, ticket++);
    } else if (round && WeightsFirstEligible(u)) {
      ring_ticket_[u - 1] = ticket;
      PostWeightsOnly(u, /*chunk=*/-1, args, ticket++);
    } else {
      PostUpdate(u, lr, grad_scale, step_ + 1);
    }
  }
  if (head_first) PostUpdate(head, lr, grad_scale, step_ + 1);
  for (auto u = early.rbegin(); u != early.rend(); ++u) PostUpdate(*u, lr, grad_scale, step_ + 1);
  if (embed_first) PostUpdate(0, lr, grad_scale, step_ + 1);
  busy_.weights_first = round;
  updates_posted_ = true;
}

void SlidingTrainer::PostWeightsOnly(size_t unit, int64_t chunk, const AdamWStepArgs& args, int64_t ticket) {
  const at::Tensor grad = accum_ > 1 ? grad_accum_[unit] : LandingBuffer(unit);
  const bool edge = chunk >= 0;
  const size_t worker_unit = edge ? EdgeChunkUnit(/*head=*/unit + 1 == layout_.units.size(), chunk) : EarlyUnit(unit);
  const Range range = edge ? EdgeChunk(unit, chunk) : Range{0, layout_.units[unit].numel};
  worker_->Post(worker_unit, [this, unit, chunk, range, args, grad, ticket] {
    at::Tensor out = weight_ring_->Acquire(ticket);  // may wait for the device copy of ticket - ring size
    const int64_t t0 = NowNs(), b = range.begin;
    UpdateRange(unit, b, range.n, master_.units[unit].data_ptr<float>() + b, exp_avg_.units[unit].data_ptr<float>() + b,
                exp_avg_sq_.units[unit].data_ptr<float>() + b, grad, args,
                reinterpret_cast<c10::BFloat16*>(out.data_ptr()));
    const int64_t took_ns = NowNs() - t0;
    update_ns_ += took_ns;
    weights_only_ns_ += took_ns;
    TraceUpdate("adamw-" + WeightsPassName(unit, chunk), took_ns);
  });
}

void SlidingTrainer::CancelWeightRing() {
  if (!weight_ring_) return;
  weight_ring_->Cancel();
  std::fill(ring_ticket_.begin(), ring_ticket_.end(), -1);
  edge_ticket_[0] = edge_ticket_[1] = -1;
}

void SlidingTrainer::TakeWorkerErrors() {
  for (UpdateWorker* w : {worker_.get(), stream_worker_.get()}) {
    if (w == nullptr) continue;
    std::string error = w->TakeError();
    if (update_error_.empty()) update_error_ = error;
  }
}

void SlidingTrainer::CheckUpdates() {
  TakeWorkerErrors();
  TORCH_CHECK(update_error_.empty(), "optimizer update failed: ", update_error_);
}

Status SlidingTrainer::SyncUpdates() {
  WaitAllWorkers();
  try {
    queue_->SyncStreamedUpdates();
  } catch (const std::exception& e) {
    if (update_error_.empty()) update_error_ = e.what();
  }
  TakeWorkerErrors();
  if (!update_error_.empty()) return Internal("optimizer update failed: " + update_error_);
  return tier_ ? tier_->Flush() : Status::Ok();
}

// Embedding and layers without autograd, keeping each layer's input in `parked` when given; window-1 layers
// load ahead of the one computing, and the head loads while the last layer computes.
at::Tensor SlidingTrainer::ForwardTrunk(const at::Tensor& ids, const RopeTables& rope,
                                        std::vector<at::Tensor>* parked) {
  at::AutoGradMode no_grad(false);
  const int64_t L = layout_.num_layers(), W = opts_.window;
  queue_->UseSlot(static_cast<int>(W));
  queue_->BeginCompute();
  at::Tensor x = EmbeddingForward(layout_.embed(), embed_dev_, ids);
  queue_->EndCompute();
  for (int64_t i = 0; i < std::min(W, L); ++i) Prefetch(i);
  for (int64_t i = 0; i < L; ++i) {
    if (parked != nullptr) (*parked)[i] = Park(x, i);
    EnsureLoaded(i);
    const int w = static_cast<int>(i % W);
    const bool in_slot = !Resident(1 + i);
    if (in_slot) queue_->UseSlot(w);
    queue_->BeginCompute();
    x = DecoderLayerForward(cfg_, layout_.layer(i), SlotView(i), x, rope);
    queue_->EndCompute();
    if (in_slot) queue_->ReleaseSlot(w);
    // Layers whose update is done load ahead into the free slots; the next layer's compute waits only for its
    // own update and upload (EnsureLoaded at the top of its iteration), never for a later layer's update.
    for (int64_t j = i + 1; j <= std::min(i + W, L - 1); ++j) Prefetch(j);
  }
  LoadEdgeUnit(/*head=*/true);
  return x;
}

StatusOr<StepStats> SlidingTrainer::Step(const std::vector<MicroBatch>& micro_batches) {
  return StatusFromExceptions<StepStats>([&] { return RunStep(micro_batches); });
}

StatusOr<double> SlidingTrainer::EvalLoss(const std::vector<MicroBatch>& micro_batches) {
  return StatusFromExceptions<double>([&] { return RunEval(micro_batches); });
}

double SlidingTrainer::RunEval(const std::vector<MicroBatch>& micro_batches) {
  TORCH_CHECK(!micro_batches.empty(), "evaluation needs at least one micro-batch");
  CancelRingOnThrow guard([this] { CancelWeightRing(); });
  // The next step's time is not its schedule's: this forward takes the ring, so that step loads from staging after
  // the whole updates, and the automatic choice must not count it.
  updates_posted_ = false;
  int64_t valid = 0;
  for (const auto& mb : micro_batches) valid += CheckedTargetCount(mb.targets, cfg_.vocab_size);
  const double normalizer = std::max<int64_t>(1, valid);
  LoadEdgeUnit(/*head=*/false);
  at::AutoGradMode no_grad(false);
  at::Tensor loss_sum = at::zeros({}, device_opts_.dtype(at::kFloat));
  for (const auto& mb : micro_batches) {
    at::Tensor ids = mb.input_ids.to(opts_.train.device);
    at::Tensor x = ForwardTrunk(ids, Rope(ids.size(1)), nullptr);
    queue_->UseSlot(static_cast<int>(opts_.window) + 1);
    loss_sum.add_(HeadLoss(cfg_, layout_.head(), head_dev_, LmHeadWeight(layout_, embed_dev_, head_dev_), x,
                           mb.targets.to(opts_.train.device), normalizer, opts_.train.loss));
  }
  queue_->TakeBusy();  // evaluation time is not part of the next step's accounting
  return loss_sum.item<double>();
}

int64_t PhaseMemory::Max() const { return std::max({step_start, forward, head, layers, embedding, update}); }

void PhaseMemory::Include(const PhaseMemory& other) {
  for (auto [mine, theirs] : {std::pair{&step_start, other.step_start},
                              {&forward, other.forward},
                              {&head, other.head},
                              {&layers, other.layers},
                              {&embedding, other.embedding},
                              {&update, other.update}})
    *mine = std::max(*mine, theirs);
}

namespace {
// Peaks one phase at a time into `memory` (cleared, with what the step starts with): Begin restarts the allocator's
// peak, End folds the phase's peak into `peak` (max over micro-batches and layers). Off: does nothing.
class PhasePeakProbe {
 public:
  PhasePeakProbe(bool on, PhaseMemory& memory) : on_(on) {
    memory = PhaseMemory{};
    if (on_) memory.step_start = ReadDeviceAllocatorStats().allocated_bytes;
  }
  void Begin() const {
    if (on_) RestartDevicePeak();
  }
  void End(int64_t& peak) const {
    if (on_) peak = std::max(peak, ReadDeviceAllocatorStats().peak_allocated_bytes);
  }

 private:
  bool on_;
};
}  // namespace

StepStats SlidingTrainer::RunStep(const std::vector<MicroBatch>& micro_batches) {
  TORCH_CHECK(!micro_batches.empty(), "a step needs at least one micro-batch");
  CancelRingOnThrow guard([this] { CancelWeightRing(); });
  CheckUpdates();
  const bool ran_weights_first = busy_.weights_first;  // the last step posted the updates this step runs
  const bool ran_updates = updates_posted_;            // not after a checkpoint or an evaluation waited for them
  updates_posted_ = false;
  busy_ = ResourceBusy{};
  ScopedTimer step_timer(busy_.step);
  // The schedule of the updates this step posts, chosen before its gradients land: a streamed unit's gradient goes
  // to the worker that will update it.
  weights_first_step_ = ChooseWeightsFirst();
  const int64_t whole_adamw_ns_before = whole_adamw_ns_.load();
  const int64_t update_ns_before = update_ns_.load(), nvme_ns_before = nvme_wait_ns_.load(),
                weights_only_ns_before = weights_only_ns_.load();

  for (const auto& mb : micro_batches)
    TORCH_CHECK(planned_tokens_ == 0 || mb.input_ids.numel() <= planned_tokens_, "micro-batch of ",
                mb.input_ids.numel(), " tokens exceeds the ", planned_tokens_, " the memory plan was made for");
  accum_ = static_cast<int64_t>(micro_batches.size());
  if (accum_ > 1 && grad_accum_.empty()) {  // built whole before it is kept: a failed allocation leaves none
    std::vector<at::Tensor> sums;
    for (size_t u = 0; u < layout_.units.size(); ++u)
      sums.push_back(Resident(u)        ? at::Tensor()
                     : StreamCapable(u) ? queue_->AllocateHost(layout_.units[u].numel, at::kFloat)  // copied up
                                        : HostArray(layout_.units[u].numel, at::kFloat, opts_.host_huge_pages));
    grad_accum_ = std::move(sums);
  }

  StepStats stats;
  for (const auto& mb : micro_batches) stats.valid_targets += CheckedTargetCount(mb.targets, cfg_.vocab_size);
  const double normalizer = std::max<int64_t>(1, stats.valid_targets);
  const bool clip = opts_.train.max_grad_norm > 0;
  const double lr = opts_.train.schedule.At(step_);
  const int64_t L = layout_.num_layers(), W = opts_.window;
  const size_t head_unit = layout_.units.size() - 1;
  const int embed_slot = static_cast<int>(W), head_slot = embed_slot + 1;
  device_sqnorm_.clear();
  at::Tensor loss_sum = at::zeros({}, device_opts_.dtype(at::kFloat));
  const PhasePeakProbe probe(opts_.measure_phase_memory && on_cuda_, phase_memory_);

  LoadEdgeUnit(/*head=*/false);
  for (size_t mb = 0; mb < micro_batches.size(); ++mb) {
    const bool first = mb == 0, last = mb + 1 == micro_batches.size();
    at::Tensor ids = micro_batches[mb].input_ids.to(opts_.train.device);
    at::Tensor targets = micro_batches[mb].targets.to(opts_.train.device);
    const RopeTables& rope = Rope(ids.size(1));

    std::vector<at::Tensor> parked(L);
    probe.Begin();
    at::Tensor x = ForwardTrunk(ids, rope, &parked);
    probe.End(phase_memory_.forward);

    // Head: forward and backward at once (the chunked loss computes its gradients in the forward).
    at::Tensor embed_leaf = embed_dev_.detach().requires_grad_(true);
    at::Tensor head_leaf = head_dev_.detach().requires_grad_(true);
    at::Tensor dx;
    probe.Begin();
    {
      at::Tensor xl = x.detach().requires_grad_(true);
      queue_->UseSlot(head_slot);
      queue_->BeginCompute();
      at::Tensor loss = HeadLoss(cfg_, layout_.head(), head_leaf, LmHeadWeight(layout_, embed_leaf, head_leaf), xl,
                                 targets, normalizer, opts_.train.loss);
      loss.backward();
      loss_sum.add_(loss.detach());
      dx = xl.grad();
      queue_->EndCompute();
    }
    LandGrad(head_unit, head_leaf.grad(), first, last);
    probe.End(phase_memory_.head);
    if (last && !clip) PostUpdate(head_unit, lr, 1.0f, step_ + 1);

    // Backward through the layers in reverse, recomputing each from its saved input.
    for (int64_t i = L - 1; i >= 0; --i) {
      EnsureLoaded(i);
      probe.Begin();
      const int w = static_cast<int>(i % W);
      const bool in_slot = !Resident(1 + i);
      at::Tensor weights = SlotView(i).detach().requires_grad_(true);
      const bool from_host = opts_.checkpoints_on_host;
      if (from_host) {  // parked inputs come back one layer ahead of their backward
        if (i == L - 1) Unpark(i, parked[i]);
        if (i > 0) Unpark(i - 1, parked[i - 1]);
      }
      at::Tensor xi = (from_host ? ParkedOnDevice(i, parked[i]) : parked[i]).detach().requires_grad_(true);
      if (in_slot) queue_->UseSlot(w);
      if (from_host) queue_->UseSlot(ParkedSlot(i));
      queue_->BeginCompute();
      at::Tensor y = DecoderLayerForward(cfg_, layout_.layer(i), weights, xi, rope);
      y.backward(dx);
      dx = xi.grad();
      queue_->EndCompute();
      if (in_slot) queue_->ReleaseSlot(w);
      if (from_host) queue_->ReleaseSlot(ParkedSlot(i));
      parked[i] = at::Tensor();
      if (i - W >= 0) EnsureLoaded(i - W);
      LandGrad(1 + i, weights.grad(), first, last);
      probe.End(phase_memory_.layers);
      if (last && !clip) PostUpdate(1 + i, lr, 1.0f, step_ + 1);
    }

    // Embedding backward; with tied weights embed_leaf already holds the LM head's share.
    probe.Begin();
    queue_->BeginCompute();
    at::Tensor x0 = EmbeddingForward(layout_.embed(), embed_leaf, ids);
    x0.backward(dx);
    queue_->EndCompute();
    LandGrad(0, embed_leaf.grad(), first, last);
    probe.End(phase_memory_.embedding);
    if (last && !clip) PostUpdate(0, lr, 1.0f, step_ + 1);
  }
  probe.Begin();

  // Global norm: device-side squares (no accumulation) or host-side ones once every unit has accumulated.
  stats.loss = loss_sum.item<double>();
  CheckUpdates();  // an update that failed during this step (this step's forward may have read its unit)
  double sq = 0;
  if (accum_ > 1) {
    ScopedTimer t(busy_.wait_update);
    WaitAllWorkers();
    for (size_t u = 0; u < unit_sqnorm_.size(); ++u) {
      if (!Resident(u)) continue;
      const double norm = dev_norm_[u].item<double>();
      unit_sqnorm_[u] = norm * norm;
    }
    for (double s : unit_sqnorm_) sq += s;
  } else {
    sq = at::stack(device_sqnorm_).sum().item<double>();
  }
  stats.grad_norm = std::sqrt(sq);
  if (clip) {
    // Exact clipping: every unit's update waits for the global norm; they run in forward order so the next
    // step's forward can start as soon as the embedding and layer 0 are done.
    const float coef = static_cast<float>(std::min(1.0, opts_.train.max_grad_norm / (stats.grad_norm + 1e-6)));
    PostUpdates(lr, coef);
  }
  ++step_;
  ++weights_version_;
  stats.step = step_;
  stats.lr = lr;
  std::vector<TraceSpan> device_spans;
  QueueBusy q = queue_->TakeBusy(opts_.trace ? &device_spans : nullptr);
  probe.End(phase_memory_.update);
  if (opts_.trace) {
    std::lock_guard<std::mutex> lock(trace_mu_);
    trace_ = std::move(pending_trace_);
    pending_trace_.clear();
    trace_.insert(trace_.end(), device_spans.begin(), device_spans.end());
  }
  busy_.compute = q.compute;
  busy_.h2d = q.h2d;
  busy_.d2h = q.d2h;
  busy_.cpu_update = (update_ns_.load() - update_ns_before) / 1e9;
  // The CPU's whole AdamW per element, over the elements that streamed instead (none when nothing did).
  const double streamed_adamw_s = (whole_adamw_ns_.load() - whole_adamw_ns_before) / 1e9 * streamed_per_cpu_element_;
  busy_.cpu_update_weights = (weights_only_ns_.load() - weights_only_ns_before) / 1e9;
  weights_first_policy_.Record({.step_s = step_timer.Elapsed(),
                                .compute_s = busy_.compute,
                                // mostly the updates the last step posted; as if the streamed ones ran on the CPU
                                .cpu_update_s = busy_.cpu_update + (ran_weights_first ? 0 : streamed_adamw_s),
                                .ran_updates = ran_updates,
                                .ran_weights_first = ran_weights_first});
  busy_.nvme = (nvme_wait_ns_.load() - nvme_ns_before) / 1e9;
  busy_.device_update = q.device_update;
  return stats;
}

ModelParams SlidingTrainer::Master() {
  Status st = SyncUpdates();
  TORCH_CHECK(st.ok(), st.ToString());
  ModelParams out;
  out.layout = layout_;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    auto state = ReadState(0, u);
    TORCH_CHECK(state.ok(), state.status().ToString());
    out.units.push_back(state->to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true));
  }
  return out;
}

// Checkpoint kind (0 master, 1 exp_avg, 2 exp_avg_sq) -> the tier's array, and the host buffer that holds it
// when the tier does not (null when it does).
at::Tensor* SlidingTrainer::HostState(int kind, size_t unit, StateArray* array) {
  *array = kind == 0 ? kMasterArray : kind == 1 ? kExpAvg : kExpAvgSq;
  const bool on_disk = OnTier(unit) && (*array != kMasterArray || tier_->holds_master());
  return on_disk ? nullptr : &(kind == 0 ? master_ : kind == 1 ? exp_avg_ : exp_avg_sq_).units[unit];
}

StatusOr<at::Tensor> SlidingTrainer::ReadState(int kind, size_t unit) {
  if (kind < 0 || kind > 2 || unit >= layout_.units.size()) return InvalidArgument("no such optimizer state");
  if (Resident(unit)) return (kind == 0 ? dev_master_ : kind == 1 ? dev_exp_avg_ : dev_exp_avg_sq_)[unit].cpu();
  StateArray array;
  if (at::Tensor* host = HostState(kind, unit, &array)) return *host;
  at::Tensor out = at::empty({layout_.units[unit].numel}, at::kFloat);
  SLIDE_RETURN_IF_ERROR(tier_->ReadArray(tier_index_[unit], array, out.data_ptr<float>()));
  return out;
}

Status SlidingTrainer::WriteState(int kind, size_t unit, const at::Tensor& src) {
  if (kind < 0 || kind > 2 || unit >= layout_.units.size()) return InvalidArgument("no such optimizer state");
  if (Resident(unit)) {
    (kind == 0 ? dev_master_ : kind == 1 ? dev_exp_avg_ : dev_exp_avg_sq_)[unit].copy_(src);
    return Status::Ok();
  }
  StateArray array;
  if (at::Tensor* host = HostState(kind, unit, &array)) {
    host->copy_(src);
    return Status::Ok();
  }
  const at::Tensor f32 = src.to(at::kFloat).contiguous();
  SLIDE_RETURN_IF_ERROR(tier_->WriteArray(tier_index_[unit], array, f32.data_ptr<float>()));
  if (array == kMasterArray) staging_[unit].copy_(f32);  // StateRestored cannot read a master it does not hold
  return Status::Ok();
}

void SlidingTrainer::StateRestored(int64_t steps_done) {
  WaitForUpdates();
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    if (Resident(u) && !dev_weights_[u].is_same(dev_master_[u])) dev_weights_[u].copy_(dev_master_[u]);
    if (master_.units[u].defined() && !staging_[u].is_same(master_.units[u]))
      staging_[u].copy_(master_.units[u]);  // RNE, as AdamW writes it
  }
  step_ = steps_done;
  ++weights_version_;  // every slot and edge unit reloads
}

}  // namespace slide
