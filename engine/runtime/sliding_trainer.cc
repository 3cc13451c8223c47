#include "engine/runtime/sliding_trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <utility>

#include "engine/optim/adamw_8bit.h"
#include "engine/quant/nf4.h"
#include "engine/runtime/adapter_store.h"
#include "engine/runtime/device_info.h"
#include "engine/runtime/device_queue.h"
#include "engine/runtime/slot_window.h"
#include "engine/runtime/torch_status.h"
#include "engine/runtime/trainer_resolver.h"
#include "engine/runtime/unit_store.h"
#include "engine/runtime/update_scheduler.h"

namespace slide {
namespace {

// Cancels the weights-first ring when a step or an evaluation ends early (an error returned or thrown part way):
// passes waiting for loads that will not come go on, and a later step or evaluation loads from staging instead of
// waiting behind them (or reading a stale round). Done() on success.
class CancelRingUnlessDone {
 public:
  explicit CancelRingUnlessDone(UpdateScheduler& updates) : updates_(updates) {}
  ~CancelRingUnlessDone() {
    if (done_) return;
    try {
      updates_.CancelWeightRing();
    } catch (...) {  // already unwinding with the step's error
    }
  }
  void Done() { done_ = true; }

 private:
  UpdateScheduler& updates_;
  bool done_ = false;
};

// Micro-batches as a step or an evaluation takes them, checked on the host before anything reaches the device (an
// id outside the vocabulary would be a device-side assert on CUDA): token ids [batch, seq] in [0, vocab), targets of
// the same shape, each -100 or a token id; at most `planned_tokens` a micro-batch (0: unplanned). Returns the number
// of targets that count.
StatusOr<int64_t> CheckMicroBatches(const std::vector<MicroBatch>& mbs, int64_t vocab, int64_t planned_tokens) {
  if (mbs.empty()) return InvalidArgument("a step or an evaluation needs at least one micro-batch");
  int64_t valid = 0;
  for (size_t k = 0; k < mbs.size(); ++k) {
    const at::Tensor& ids = mbs[k].input_ids;
    const at::Tensor& targets = mbs[k].targets;
    const std::string where = "micro-batch " + std::to_string(k) + ": ";
    if (!ids.defined() || ids.dim() != 2 || !at::isIntegralType(ids.scalar_type(), /*includeBool=*/false))
      return InvalidArgument(where + "input_ids must be token ids of shape [batch, seq]");
    if (!targets.defined() || targets.numel() != ids.numel() ||
        !at::isIntegralType(targets.scalar_type(), /*includeBool=*/false))
      return InvalidArgument(where + "targets must be integers, one per input token");
    if (planned_tokens > 0 && ids.numel() > planned_tokens)
      return InvalidArgument(where + std::to_string(ids.numel()) + " tokens exceed the " +
                             std::to_string(planned_tokens) + " the memory plan was made for");
    if (ids.is_cpu()) {
      const at::Tensor t = ids.to(at::kLong).contiguous();
      const int64_t* p = t.const_data_ptr<int64_t>();
      for (int64_t i = 0, n = t.numel(); i < n; ++i)
        if (p[i] < 0 || p[i] >= vocab)
          return InvalidArgument(where + "token id " + std::to_string(p[i]) + " at position " + std::to_string(i) +
                                 " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    try {  // the same check the reference trainer makes (a c10::Error naming the first bad target)
      valid += CheckedTargetCount(targets, vocab);
    } catch (const c10::Error& e) {
      return InvalidArgument(where + e.what_without_backtrace());
    }
  }
  return valid;
}

ModelParams AdoptOrConvert(ModelParams&& master) {
  bool adoptable = true;
  for (const auto& t : master.units)
    adoptable = adoptable && t.scalar_type() == at::kFloat && t.is_cpu() && t.is_contiguous();
  return adoptable ? std::move(master) : master.To(at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

Status ValidateSlidingOptions(const SlidingOptions& o, const ModelLayout& layout) {
  const auto dtype = o.train.compute_dtype;
  if (dtype != c10::kBFloat16 && dtype != c10::kFloat)
    return InvalidArgument("the sliding trainer computes in bf16 or fp32");
  if (o.window < 1) return InvalidArgument("window must be at least 1 slot, got " + std::to_string(o.window));
  if (o.resident_layers < 0 || o.resident_layers > layout.num_layers())
    return InvalidArgument("resident layers must be between 0 and the layer count (" +
                           std::to_string(layout.num_layers()) + "), got " + std::to_string(o.resident_layers));
  const bool tier = o.nvme.mode != TierMode::kNone;
  if (tier) SLIDE_RETURN_IF_ERROR(TierUnitIndex(layout.num_layers(), o.nvme).status());
  if (tier && o.resident_layers > 0) return InvalidArgument("resident layers cannot be combined with the NVMe tier");
  const double share = o.device_update_share;
  if (!(share >= 0 && share <= 1))
    return InvalidArgument("device_update_share must be in [0, 1], got " + std::to_string(share));
  if (share > 0 && dtype != c10::kBFloat16) return InvalidArgument("streamed updates need bf16 compute");
  if (share > 0 && tier) return InvalidArgument("streamed updates cannot be combined with the NVMe tier");
  if (share > 0 && o.device_update_chunk < 1) return InvalidArgument("device_update_chunk must be positive");
  if (o.adapter) {
    if (o.resident_layers > 0 || tier || share > 0 || o.weights_first == WeightsFirst::kOn)
      return InvalidArgument(
          "adapter mode keeps the base frozen in host memory and slides it through the window (no resident layers, "
          "NVMe tier, device update share or weights-first pass)");
    if (o.train.optimizer != OptimizerKind::kAdamW) return InvalidArgument("adapters train with fp32 AdamW");
  }
  if (o.nf4_base) {
    if (!o.adapter) return InvalidArgument("an NF4 base is frozen: it needs adapter mode");
    for (int64_t l = 0; l < layout.num_layers(); ++l)
      for (const ParamSpec& p : layout.layer(l).params)
        if (p.shape.size() == 2) SLIDE_RETURN_IF_ERROR(CheckNf4Numel(p.numel, p.name));
  }
  // 8-bit moments: host-held units updated by the CPU kernel (their moments optionally on the NVMe tier, whole units
  // a chunk; the master stays in host memory), streamed units and resident units by the device kernel.
  if (o.train.optimizer == OptimizerKind::kAdamW8bit && o.nvme.mode == TierMode::kMomentsAndMaster)
    return InvalidArgument(
        "optimizer adamw_8bit keeps the master in host memory (its moments may go to the NVMe tier, not the master)");
  if (o.train.optimizer == OptimizerKind::kAdamW8bit && share > 0 && o.device_update_chunk < kQuantBlock)
    return InvalidArgument("streamed 8-bit updates move whole blocks: device_update_chunk must be at least " +
                           std::to_string(kQuantBlock) + ", got " + std::to_string(o.device_update_chunk));
  return Status::Ok();
}

SlidingTrainer::SlidingTrainer(ModelConfig cfg, const ModelParams& master_fp32, SlidingOptions options,
                               std::unique_ptr<StateTier> tier)
    : SlidingTrainer(std::move(cfg), master_fp32.To(at::TensorOptions().dtype(at::kFloat)), std::move(options),
                     std::move(tier)) {}

SlidingTrainer::SlidingTrainer(ModelConfig cfg, ModelParams&& master_fp32, SlidingOptions options,
                               std::unique_ptr<StateTier> tier, std::vector<Nf4Unit> nf4_layers)
    : cfg_(std::move(cfg)),
      layout_(master_fp32.layout),
      opts_(std::move(options)),
      simd_(DetectSimdLevel()),
      meter_(opts_.trace) {
  const Status valid = ValidateSlidingOptions(opts_, layout_);
  TORCH_CHECK(valid.ok(), valid.ToString());
  if (opts_.adapter) opts_.weights_first = WeightsFirst::kOff;  // nothing on the host is updated
  const auto dtype = opts_.train.compute_dtype;
  on_cuda_ = opts_.train.device.is_cuda();
  device_opts_ = at::TensorOptions().dtype(dtype).device(opts_.train.device);
  if (on_cuda_) LimitDeviceMemory(opts_.device_budget_bytes);
  queue_ = MakeDeviceQueue(opts_.train.device, SlotWindow::QueueSlots(opts_.window));
  // Adapter mode takes the base as loaded (bf16 keeps the host at 2 bytes a parameter); the store converts it.
  units_ = std::make_unique<UnitStore>(opts_.adapter ? std::move(master_fp32) : AdoptOrConvert(std::move(master_fp32)),
                                       opts_, *queue_, std::move(tier), std::move(nf4_layers));
  if (opts_.adapter) adapters_ = std::make_unique<AdapterStore>(cfg_, *opts_.adapter, device_opts_);
  window_ = std::make_unique<SlotWindow>(cfg_, *units_, *queue_, opts_.window, device_opts_, opts_.checkpoints_on_host);
  updates_ = std::make_unique<UpdateScheduler>(*units_, *queue_, meter_, opts_, simd_);
}

SlidingTrainer::~SlidingTrainer() {
  adapters_.reset();
  updates_.reset();
  queue_.reset();
  window_.reset();
  units_.reset();
}

StatusOr<std::unique_ptr<StateTier>> SlidingTrainer::OpenTier(const ModelLayout& layout,
                                                              const SlidingOptions& options) {
  return UnitStore::OpenTier(layout, options);
}

StatusOr<std::unique_ptr<SlidingTrainer>> SlidingTrainer::Create(ModelConfig cfg, ModelParams&& master_fp32,
                                                                 const ResolvedTrainer& resolved,
                                                                 std::vector<Nf4Unit> nf4_layers) {
  SLIDE_RETURN_IF_ERROR(ValidateSlidingOptions(resolved.options, master_fp32.layout));
  SLIDE_ASSIGN_OR_RETURN(std::unique_ptr<StateTier> tier, OpenTier(master_fp32.layout, resolved.options));
  // What can still fail is the environment: host or device memory (RESOURCE_EXHAUSTED), a tier write.
  return StatusFromExceptions<std::unique_ptr<SlidingTrainer>>([&]() -> StatusOr<std::unique_ptr<SlidingTrainer>> {
    auto trainer = std::make_unique<SlidingTrainer>(std::move(cfg), std::move(master_fp32), resolved.options,
                                                    std::move(tier), std::move(nf4_layers));
    trainer->planned_tokens_ = resolved.planned_tokens;
    return trainer;
  });
}

StatusOr<std::unique_ptr<SlidingTrainer>> SlidingTrainer::Create(ModelConfig cfg, ModelParams&& master_fp32,
                                                                 SlidingOptions options, PlanRequest budget,
                                                                 MemoryPlan* plan_out) {
  SLIDE_ASSIGN_OR_RETURN(ResolvedTrainer resolved, ResolveTrainer(cfg, std::move(options), std::move(budget)));
  if (plan_out != nullptr) *plan_out = resolved.plan;
  return Create(std::move(cfg), std::move(master_fp32), resolved);
}

const StateTier* SlidingTrainer::tier() const { return units_->tier(); }
int64_t SlidingTrainer::ring_loads() const { return updates_->ring_loads(); }
int64_t SlidingTrainer::edge_ring_chunks() const { return updates_->edge_ring_chunks(); }
int64_t SlidingTrainer::streamed_units() const { return units_->streamed_units(); }
bool SlidingTrainer::schedule_settled() const { return updates_->schedule_settled(); }
void SlidingTrainer::set_weights_first(WeightsFirst mode) { updates_->set_weights_first(mode); }
int64_t SlidingTrainer::pinned_bytes() const { return queue_->pinned_bytes(); }
int64_t SlidingTrainer::parked_bytes() const { return window_->parked_bytes(); }

void SlidingTrainer::Prefetch(int64_t layer) {
  if (updates_->LoadReady(layer)) EnsureLoaded(layer);
}

void SlidingTrainer::EnsureLoaded(int64_t layer) {
  if (!window_->InSlot(layer)) return;  // resident: always there, updated in place
  if (window_->HoldsCurrent(layer)) return;
  const int slot = window_->LayerSlot(layer);
  const at::Tensor dst = window_->LayerWeights(layer);
  if (const std::shared_ptr<const Nf4Unit>& nf4 = (*units_)[1 + layer].nf4) {  // frozen: no update to wait for
    queue_->LoadSlotNf4(slot, dst, layout_.layer(layer), *nf4);
    window_->MarkLoaded(layer);
    ++slot_loads_;
    return;
  }
  updates_->LoadLayer(layer, [&](const at::Tensor& src, int64_t after_update) {
    return queue_->LoadSlot(slot, dst, src, after_update);
  });
  window_->MarkLoaded(layer);
  ++slot_loads_;
}

void SlidingTrainer::LoadEdgeUnit(bool head) {
  if (window_->EdgeCurrent(head)) return;
  const int slot = window_->EdgeSlot(head);
  at::Tensor& dst = window_->Edge(head);
  updates_->LoadEdge(head, [&](int64_t begin, int64_t n, const at::Tensor& src) {
    return queue_->LoadSlot(slot, n == dst.numel() ? dst : dst.narrow(0, begin, n), src);
  });
  window_->MarkEdgeLoaded(head);
  ++slot_loads_;
}

void SlidingTrainer::WaitForUpdates() {
  updates_->WaitAll();
  queue_->SyncStreamedUpdates();
}

Status SlidingTrainer::SyncUpdates() { return updates_->Sync(); }

// Window-1 layers load ahead of the one computing, and the head loads while the last layer computes.
at::Tensor SlidingTrainer::ForwardTrunk(const at::Tensor& ids, const RopeTables& rope, std::vector<at::Tensor>* parked,
                                        int64_t micro_batch) {
  at::AutoGradMode no_grad(false);
  const int64_t L = layout_.num_layers(), W = opts_.window;
  queue_->UseSlot(window_->EdgeSlot(/*head=*/false));
  queue_->BeginCompute();
  at::Tensor x = EmbeddingForward(layout_.embed(), window_->Edge(false), ids);
  queue_->EndCompute();
  for (int64_t i = 0; i < std::min(W, L); ++i) Prefetch(i);
  for (int64_t i = 0; i < L; ++i) {
    if (parked != nullptr) (*parked)[i] = window_->Park(x, i);
    EnsureLoaded(i);
    const int w = window_->LayerSlot(i);
    const bool in_slot = window_->InSlot(i);
    if (in_slot) queue_->UseSlot(w);
    queue_->BeginCompute();
    if (adapters_) {
      const LayerAdapter adapter =
          adapters_->Forward(i, AdapterDropout(parked != nullptr), DropoutSeed(micro_batch, i));
      x = DecoderLayerForward(cfg_, layout_.layer(i), window_->LayerWeights(i), x, rope, &adapter);
    } else {
      x = DecoderLayerForward(cfg_, layout_.layer(i), window_->LayerWeights(i), x, rope);
    }
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
  SLIDE_ASSIGN_OR_RETURN(const int64_t valid, CheckMicroBatches(micro_batches, cfg_.vocab_size, planned_tokens_));
  if (Status failed = updates_->status(); !failed.ok()) {
    updates_->CancelWeightRing();  // no forward will read what waits there
    return failed;
  }
  return StatusFromExceptions<StepStats>([&] { return RunStep(micro_batches, valid); });
}

StatusOr<double> SlidingTrainer::EvalLoss(const std::vector<MicroBatch>& micro_batches) {
  SLIDE_ASSIGN_OR_RETURN(const int64_t valid, CheckMicroBatches(micro_batches, cfg_.vocab_size, 0));
  return StatusFromExceptions<double>([&] { return RunEval(micro_batches, valid); });
}

double SlidingTrainer::RunEval(const std::vector<MicroBatch>& micro_batches, int64_t valid_targets) {
  CancelRingUnlessDone guard(*updates_);
  // The next step's time is not its schedule's: this forward takes the ring, so that step loads from staging after
  // the whole updates, and the automatic choice must not count it.
  updates_->ForgetPostedUpdates();
  const double normalizer = std::max<int64_t>(1, valid_targets);
  LoadEdgeUnit(/*head=*/false);
  at::AutoGradMode no_grad(false);
  at::Tensor loss_sum = at::zeros({}, device_opts_.dtype(at::kFloat));
  for (const auto& mb : micro_batches) {
    at::Tensor ids = mb.input_ids.to(opts_.train.device);
    at::Tensor x = ForwardTrunk(ids, window_->Rope(ids.size(1)), nullptr, 0);
    queue_->UseSlot(window_->EdgeSlot(/*head=*/true));
    const at::Tensor& head = window_->Edge(true);
    loss_sum.add_(HeadLoss(cfg_, layout_.head(), head, LmHeadWeight(layout_, window_->Edge(false), head), x,
                           mb.targets.to(opts_.train.device), normalizer, opts_.train.loss));
  }
  queue_->TakeBusy();  // evaluation time is not part of the next step's accounting
  const double loss = loss_sum.item<double>();
  guard.Done();
  return loss;
}

at::Tensor SlidingTrainer::HeadBackward(const at::Tensor& x, const at::Tensor& targets, double normalizer,
                                        const at::Tensor& embed_leaf, const at::Tensor& head_leaf,
                                        at::Tensor& loss_sum) {
  at::Tensor xl = x.detach().requires_grad_(true);
  queue_->UseSlot(window_->EdgeSlot(/*head=*/true));
  queue_->BeginCompute();
  at::Tensor loss = HeadLoss(cfg_, layout_.head(), head_leaf, LmHeadWeight(layout_, embed_leaf, head_leaf), xl, targets,
                             normalizer, opts_.train.loss);
  loss.backward();
  loss_sum.add_(loss.detach());
  at::Tensor dx = xl.grad();
  queue_->EndCompute();
  return dx;
}

// Layer i is loaded. Parked inputs come back one layer ahead of their backward; the slot the layer used reloads
// layer i - W; the gradient lands.
at::Tensor SlidingTrainer::LayerBackward(int64_t i, std::vector<at::Tensor>& parked, at::Tensor dx,
                                         const RopeTables& rope, bool first, bool last, int64_t micro_batch) {
  const int w = window_->LayerSlot(i);
  const bool in_slot = window_->InSlot(i);
  // Adapter mode: the base weights are frozen; the adapter's leaf takes the gradient, and layer 0's input needs none.
  at::Tensor weights = window_->LayerWeights(i).detach().requires_grad_(!adapters_);
  const at::Tensor adapter_leaf = adapters_ ? adapters_->Leaf(i) : at::Tensor();
  const bool from_host = window_->parks_on_host();
  if (from_host) {
    if (i == layout_.num_layers() - 1) window_->Unpark(i, parked[i]);
    if (i > 0) window_->Unpark(i - 1, parked[i - 1]);
  }
  at::Tensor xi =
      (from_host ? window_->ParkedOnDevice(i, parked[i]) : parked[i]).detach().requires_grad_(!adapters_ || i > 0);
  if (in_slot) queue_->UseSlot(w);
  if (from_host) queue_->UseSlot(window_->ParkedSlot(i));
  queue_->BeginCompute();
  at::Tensor y;
  if (adapters_) {  // the forward's dropout masks again: the same seed
    const LayerAdapter adapter =
        adapters_->WithLeaf(i, adapter_leaf, AdapterDropout(true), DropoutSeed(micro_batch, i));
    y = DecoderLayerForward(cfg_, layout_.layer(i), weights, xi, rope, &adapter);
  } else {
    y = DecoderLayerForward(cfg_, layout_.layer(i), weights, xi, rope);
  }
  y.backward(dx);
  dx.reset();  // the layer above's gradient goes back to the allocator before this one's lands
  at::Tensor dxi = xi.grad();
  queue_->EndCompute();
  if (in_slot) queue_->ReleaseSlot(w);
  if (from_host) queue_->ReleaseSlot(window_->ParkedSlot(i));
  parked[i] = at::Tensor();
  if (i - opts_.window >= 0) EnsureLoaded(i - opts_.window);
  if (adapters_)
    adapters_->LandGrad(i, adapter_leaf.grad());
  else
    updates_->LandGrad(1 + i, weights.grad(), first, last);
  return dxi;
}

StatusOr<StepStats> SlidingTrainer::RunStep(const std::vector<MicroBatch>& micro_batches, int64_t valid_targets) {
  CancelRingUnlessDone guard(*updates_);
  meter_.Begin();
  ScopedTimer step_timer(meter_.busy().step);
  // Adapter mode posts no host update: the adapters' gradient sums on the device instead.
  if (adapters_)
    adapters_->ZeroGrad();
  else
    updates_->BeginStep(static_cast<int64_t>(micro_batches.size()));

  StepStats stats;
  stats.valid_targets = valid_targets;
  const double normalizer = std::max<int64_t>(1, stats.valid_targets);
  const bool clip = opts_.train.max_grad_norm > 0;
  const bool post_as_landed = !clip && !adapters_;  // each unit's update as soon as its last gradient lands
  const double lr = opts_.train.schedule.At(step_);
  const int64_t L = layout_.num_layers();
  const size_t head_unit = layout_.units.size() - 1;
  at::Tensor loss_sum = at::zeros({}, device_opts_.dtype(at::kFloat));
  PhaseMemory& memory = meter_.phase_memory();
  const PhasePeakProbe probe(opts_.measure_phase_memory && on_cuda_, memory);

  LoadEdgeUnit(/*head=*/false);
  for (size_t mb = 0; mb < micro_batches.size(); ++mb) {
    const bool first = mb == 0, last = mb + 1 == micro_batches.size();
    at::Tensor ids = micro_batches[mb].input_ids.to(opts_.train.device);
    at::Tensor targets = micro_batches[mb].targets.to(opts_.train.device);
    const RopeTables& rope = window_->Rope(ids.size(1));

    std::vector<at::Tensor> parked(L);
    probe.Begin();
    at::Tensor x = ForwardTrunk(ids, rope, &parked, static_cast<int64_t>(mb));
    probe.End(memory.forward);

    // Head: forward and backward at once (the chunked loss computes its gradients in the forward). A frozen head
    // (adapter mode) gives the trunk's gradient alone.
    at::Tensor embed_leaf = window_->Edge(false).detach().requires_grad_(!adapters_);
    at::Tensor head_leaf = window_->Edge(true).detach().requires_grad_(!adapters_);
    probe.Begin();
    at::Tensor dx = HeadBackward(x, targets, normalizer, embed_leaf, head_leaf, loss_sum);
    if (!adapters_) updates_->LandGrad(head_unit, head_leaf.grad(), first, last);
    probe.End(memory.head);
    if (last && post_as_landed) updates_->PostUpdate(head_unit, lr, 1.0f, step_ + 1);

    // Backward through the layers in reverse, recomputing each from its saved input.
    for (int64_t i = L - 1; i >= 0; --i) {
      EnsureLoaded(i);
      probe.Begin();
      dx = LayerBackward(i, parked, std::move(dx), rope, first, last, static_cast<int64_t>(mb));
      probe.End(memory.layers);
      if (last && post_as_landed) updates_->PostUpdate(1 + i, lr, 1.0f, step_ + 1);
    }
    if (adapters_) continue;  // a frozen embedding: nothing below layer 0 to differentiate

    // Embedding backward; with tied weights embed_leaf already holds the LM head's share.
    probe.Begin();
    queue_->BeginCompute();
    at::Tensor x0 = EmbeddingForward(layout_.embed(), embed_leaf, ids);
    x0.backward(dx);
    queue_->EndCompute();
    updates_->LandGrad(0, embed_leaf.grad(), first, last);
    probe.End(memory.embedding);
    if (last && post_as_landed) updates_->PostUpdate(0, lr, 1.0f, step_ + 1);
  }
  probe.Begin();

  stats.loss = loss_sum.item<double>();
  bool weights_first = false;
  if (adapters_) {
    // The adapters' global norm, clipping and AdamW, on the device; the base's weights stay as they are, so no
    // slot reloads for the next step.
    queue_->BeginCompute();
    stats.grad_norm = adapters_->ClipGradNorm(opts_.train.max_grad_norm);
    AdamWHyper hp = opts_.train.adamw;
    hp.lr = lr;
    adapters_->Update(hp, step_ + 1);
    queue_->EndCompute();
  } else {
    // Global norm: device-side squares (no accumulation) or host-side ones once every unit has accumulated.
    // An update that failed during this step (this step's forward may have read its unit).
    SLIDE_RETURN_IF_ERROR(updates_->status());
    stats.grad_norm = std::sqrt(updates_->GlobalSqNorm());
    if (clip) {
      // Exact clipping: every unit's update waits for the global norm; they run in forward order so the next
      // step's forward can start as soon as the embedding and layer 0 are done.
      const float coef = static_cast<float>(std::min(1.0, opts_.train.max_grad_norm / (stats.grad_norm + 1e-6)));
      weights_first = updates_->PostUpdates(lr, coef, step_ + 1);
    }
    window_->NextWeightsVersion();
  }
  ++step_;
  stats.step = step_;
  stats.lr = lr;
  std::vector<TraceSpan> device_spans;
  const QueueBusy q = queue_->TakeBusy(meter_.tracing() ? &device_spans : nullptr);
  probe.End(memory.update);
  meter_.Finish(q, std::move(device_spans));
  meter_.busy().weights_first = weights_first;
  if (!adapters_)
    updates_->EndStep(step_timer.Elapsed(), q.compute, meter_.busy().cpu_update, meter_.WholeAdamWSeconds());
  guard.Done();
  return stats;
}

double SlidingTrainer::AdapterDropout(bool training) const {
  return training && adapters_ ? adapters_->lora().dropout : 0.0;
}

uint64_t SlidingTrainer::DropoutSeed(int64_t micro_batch, int64_t layer) const {
  return adapters_ ? AdapterDropoutSeed(adapters_->lora().seed, step_, micro_batch, layer) : 0;
}

ModelParams SlidingTrainer::MergedWeights() const {
  TORCH_CHECK(adapters_, "merged weights need adapter mode");
  const std::vector<at::Tensor> adapter = adapters_->MasterOnHost();
  ModelParams out;
  out.layout = layout_;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    at::Tensor w;
    if (const std::shared_ptr<const Nf4Unit>& nf4 = (*units_)[u].nf4) {  // the NF4 base, dequantised
      w = at::zeros({layout_.units[u].numel}, at::TensorOptions().dtype(opts_.train.compute_dtype));
      DequantizeNf4Unit(layout_.units[u], *nf4, w);
    } else {
      const at::Tensor& base = (*units_)[u].staging;
      w = base.to(at::kCPU, base.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    }
    if (layout_.units[u].kind == UnitKind::kDecoderLayer)
      MergeAdapter(layout_.units[u], w, adapters_->layout().layers[u - 1], adapter[u - 1], adapters_->lora().scale());
    out.units.push_back(std::move(w));
  }
  return out;
}

size_t SlidingTrainer::state_units() const {
  return adapters_ ? static_cast<size_t>(adapters_->layers()) : layout_.units.size();
}

ModelParams SlidingTrainer::Master() {
  TORCH_CHECK(!adapters_, "adapter mode has no master weights of the base (Adapters() has the trained state)");
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

StatusOr<at::Tensor> SlidingTrainer::ReadState(int kind, size_t unit) {
  if (kind < 0 || kind > 2 || unit >= state_units()) return InvalidArgument("no such optimizer state");
  if (adapters_) return adapters_->ReadState(kind, static_cast<int64_t>(unit));
  return units_->ReadState(static_cast<StateKind>(kind), unit);
}

StatusOr<StateShape> SlidingTrainer::StateShapeOf(int kind, size_t unit) const {
  if (kind < 0 || kind > 2 || unit >= state_units()) return InvalidArgument("no such optimizer state");
  if (adapters_) return StateShape{.dtype = c10::kFloat, .numel = adapters_->layout().layers[unit].numel};
  return units_->StateShapeOf(static_cast<StateKind>(kind), unit);
}

Status SlidingTrainer::WriteState(int kind, size_t unit, const at::Tensor& src) {
  if (kind < 0 || kind > 2 || unit >= state_units()) return InvalidArgument("no such optimizer state");
  if (adapters_) return adapters_->WriteState(kind, static_cast<int64_t>(unit), src);
  return units_->WriteState(static_cast<StateKind>(kind), unit, src);
}

void SlidingTrainer::StateRestored(int64_t steps_done) {
  WaitForUpdates();
  units_->RefreshWeights();
  step_ = steps_done;
  window_->NextWeightsVersion();  // every slot and edge unit reloads
}

}  // namespace slide
