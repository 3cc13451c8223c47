// SlidingTrainer: trains a model whose layers do not all fit on the device. The device holds a window of
// layer slots plus the embedding and head; fp32 master weights, AdamW moments, the compute-dtype weights the
// next forward loads, and returned gradients live on the host. A step runs
//   forward   embedding, then layer i in slot i % window (loaded from the host), keeping each layer's input;
//   head      final norm + chunked LM head + CE, forward and backward together;
//   backward  layers in reverse: reload weights, recompute the layer under autograd from its saved input,
//             backpropagate, return the flat gradient to the host;
//   transfers H2D loads, D2H gradient returns and compute run on their own CUDA streams (DeviceQueue), so
//             layer i+1 loads while layer i computes and gradients stream out during the backward;
//   resident  with room in the budget, the first layers stay on the device with their optimizer state and are
//             updated there by the AdamW kernel (no load, no gradient copy, no CPU update);
//   update    CPU AdamW per unit on the UpdateWorker thread, as gradients land (no clipping) or, with exact
//             global-norm clipping, once every unit's norm is in; the next step's forward waits per unit, so
//             updates overlap the next forward and are never stale. With the NVMe tier the moments (and
//             optionally the master) are read ahead chunk by chunk in update order and written back behind.
//   weights   under clipping the next forward may get its layer weights first (WeightsFirst): a weights-only
//   first     AdamW pass hands them to the device through a small ring, the whole update follows behind.
// The device may be the CPU itself (tests and CI run the whole schedule that way).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/io/state_tier.h"
#include "engine/memory/memory_plan.h"
#include "engine/optim/cpu_adamw.h"
#include "engine/runtime/device_queue.h"
#include "engine/runtime/reference_trainer.h"
#include "engine/runtime/step_trace.h"
#include "engine/runtime/update_worker.h"
#include "engine/runtime/weight_ring.h"
#include "engine/runtime/weights_first_policy.h"

namespace slide {

struct ResolvedTrainer;  // trainer_resolver.h

// Under exact clipping every update waits for the backward's global norm, and the next forward waits for the
// updates. Weights first: a weights-only AdamW pass (master, moments and gradient read, the bf16 weights written:
// 16 bytes an element) computes each host layer's next weights in forward order and hands them to the device
// through a ring of window + 1 page-locked layer buffers; the whole update (30 bytes) follows in reverse layer
// order, behind the next forward and ahead of the backward that reloads those layers and lands their new
// gradients. The forward waits for the short pass only; the CPU moves ~1.5x the bytes a step, so it pays when the
// device's compute can hide both passes. Bit-identical to the whole update either way.
enum class WeightsFirst {
  kAuto,  // on CUDA, by measured step times (WeightsFirstPolicy)
  kOn,    // whenever clipping with bf16 compute (tests)
  kOff,
};

struct SlidingOptions {
  TrainerOptions train;              // optimizer, schedule, clipping, compute dtype (bf16|fp32), device
  int64_t window = 2;                // layer slots on the device (>= 1)
  bool checkpoints_on_host = false;  // layer inputs parked in host memory instead of on the device
  int64_t device_budget_bytes = 0;   // > 0 on CUDA: the caching allocator may not reserve more than this
  bool trace = false;                // keep each step's timeline (last_trace)
  StateTierOptions nvme{};           // mode none: all optimizer state in host memory
  // Layers [0, resident_layers) stay on the device with their fp32 master, moments and gradient, and are
  // updated there by the AdamW kernel (bit-equal to the CPU update): they never load, never return a gradient
  // and cost the CPU update nothing. Not with the NVMe tier. The planner chooses it (PlanRequest).
  int64_t resident_layers = 0;
  // Of the layers left on the host, this share (spread evenly over them in forward order) is updated on the
  // device: chunks of the fp32 state and the gradient stream up, the AdamW kernel runs, the results stream back,
  // while the CPU updates the others, so the copy engines add their bandwidth to the CPU's. bf16 compute, no NVMe
  // tier. 0: every host unit updates on the CPU. Only in whole-update steps: a step going weights first updates
  // them on the CPU (one H100 box, 3B batch 32: the streamed state's copies took host memory bandwidth from the
  // weights-only passes the next forward waits on, 1.731 s a weights-first step against 1.590 s without streaming).
  double device_update_share = 0;
  int64_t device_update_chunk = int64_t(2) << 20;  // elements per ring buffer (3 buffers, 18 bytes per element)
  int64_t DeviceUpdateRingBytes() const { return device_update_share > 0 ? 3 * device_update_chunk * 18 : 0; }
  // Layers eligible: host-held (not resident or on the NVMe tier; streamed layers join, updated on the CPU in such
  // steps); bf16 compute with clipping only.
  WeightsFirst weights_first = WeightsFirst::kAuto;
  // The host-held fp32 master, moments and gradient sums in their own mappings (HostArray), advised for
  // transparent huge pages; off: advised against them (small pages even where THP is "always").
  bool host_huge_pages = true;
  // Measure each phase's peak device memory in every step (last_phase_memory; CUDA only). Restarts the caching
  // allocator's peak counter at each phase, so the process-wide peak it keeps is lost (benchmarks and tests).
  bool measure_phase_memory = false;
};

// The caching allocator's peak allocated bytes in each phase of the last step (SlidingOptions::
// measure_phase_memory), absolute: what the memory plan's device total less its reserve estimates at that phase.
struct PhaseMemory {
  int64_t step_start = 0;  // allocated as the step began: weights, slots, resident state, the trainer's buffers
  int64_t forward = 0;     // the layers' forward without autograd (layer inputs kept)
  int64_t head = 0;        // the LM head's loss and gradients
  int64_t layers = 0;      // the largest of the layers' recompute + backward
  int64_t embedding = 0;   // the embedding's backward
  int64_t update = 0;      // from the embedding's gradient to the step's end: the norm, the device updates
  int64_t Max() const;
  void Include(const PhaseMemory& other);  // each phase the larger of the two (peaks over several steps)
};

// The share GPU jobs stream (bf16, no NVMe tier). Measured on the H200 box (f2c8475): 3B batch 8 with 8 resident
// layers 8,781 -> 9,604 tokens/s at 0.3 and 9,417 at 0.5; 8B batch 32 7,387 -> 7,392 at 0.3 and 6,820 at 0.5 (the
// CPU and the copy engines share the host's memory bandwidth, which bounds the 8B update either way). With weights
// first automatic on one H100 box (2c6f43c): 3B batch 8 8,556 -> 10,032, batch 32 15,721 -> 17,255; 8B batch 8
// 3,220 -> 3,383.
inline constexpr double kDefaultDeviceUpdateShare = 0.3;

// The share a trainer built from a plan streams: none where the plan parks the layer inputs on the host. Their
// copies cross the PCIe link both ways every step beside the streamed state, and there the share slowed the step
// (8B batch 48, weights first automatic: 8,930 tokens/s without, 8,618 at 0.3; one H100 box, 2c6f43c).
inline double PlannedDeviceUpdateShare(double requested, bool checkpoints_on_host) {
  return checkpoints_on_host ? 0 : requested;
}

// Seconds each resource was busy in the last step: device compute / H2D / D2H from CUDA events (wall clock
// when the device is the CPU), CPU update time measured inside the update tasks.
struct ResourceBusy {
  double compute = 0;
  double h2d = 0;
  double d2h = 0;
  double cpu_update = 0;          // gradient accumulation, host norms and AdamW (posted in this step)
  double cpu_update_weights = 0;  // of cpu_update: weights-only passes (WeightsFirst)
  double nvme = 0;                // update tasks waiting on the NVMe tier (reads not in yet, write-backs pending)
  double device_update = 0;       // streamed updates that finished in this step (upload to download, per unit)
  double wait_update = 0;         // engine thread blocked on a unit's update before loading it
  double step = 0;                // wall time of Step()
  bool weights_first = false;     // this step's updates went weights first (the next forward loads from the ring)
  double MaxResource() const;
  // step / the busiest resource: 1.0 when the step costs exactly its busiest resource (everything else hidden
  // behind it); above 1 by the time nothing overlapped.
  double OverlapRatio() const;
  // What bounds the step: the busiest resource, or "update_dependency" when the engine waited on updates for
  // more than a fifth of the step (exact clipping puts every update after the backward's norm, so the next
  // forward waits for them whatever the resource totals say), or "nvme" when those updates mostly waited on
  // the disk.
  const char* Bound() const;
};

class SlidingTrainer {
 public:
  // Copies the weights. With options.nvme set the tier is opened here (a failure throws); Create reports it as a
  // status instead, or pass a tier opened for this layout.
  SlidingTrainer(ModelConfig cfg, const ModelParams& master_fp32, SlidingOptions options,
                 std::unique_ptr<StateTier> tier = nullptr);
  // Adopts the buffers when they already are fp32 on the host (no second copy of a large model).
  SlidingTrainer(ModelConfig cfg, ModelParams&& master_fp32, SlidingOptions options,
                 std::unique_ptr<StateTier> tier = nullptr);
  // Opens the NVMe tier `options` asks for (null for mode none): the disk is reserved here.
  static StatusOr<std::unique_ptr<StateTier>> OpenTier(const ModelLayout& layout, const SlidingOptions& options);

  // Builds the trainer a resolution planned (ResolveTrainer, trainer_resolver.h: a job that cannot fit was refused
  // there, with the numbers, before anything large is allocated); opens its NVMe tier. Later micro-batches larger
  // than planned are refused by Step.
  static StatusOr<std::unique_ptr<SlidingTrainer>> Create(ModelConfig cfg, ModelParams&& master_fp32,
                                                          const ResolvedTrainer& resolved);
  // ResolveTrainer(cfg, options, budget), then Create; `plan` (optional) gets the plan.
  static StatusOr<std::unique_ptr<SlidingTrainer>> Create(ModelConfig cfg, ModelParams&& master_fp32,
                                                          SlidingOptions options, PlanRequest budget,
                                                          MemoryPlan* plan = nullptr);
  ~SlidingTrainer();

  // One optimizer step over `micro_batches` (accumulated). Its errors (a micro-batch larger than planned, a failed
  // update or NVMe transfer, device memory exhausted: RESOURCE_EXHAUSTED) come back as a status: nothing thrown
  // inside the trainer, on this thread or an update worker's, leaves it. After an error the trainer is not stepped
  // again (the job fails).
  StatusOr<StepStats> Step(const std::vector<MicroBatch>& micro_batches);
  // Mean token loss over `micro_batches` with the current weights (forward only, sliding like a step).
  StatusOr<double> EvalLoss(const std::vector<MicroBatch>& micro_batches);

  // The fp32 master after every posted update has finished (a copy).
  ModelParams Master();
  // The optimizer state, for checkpoints: `kind` 0 master, 1 exp_avg, 2 exp_avg_sq of `unit`, fp32[numel].
  // Call SyncUpdates first. Reading gives the host buffer itself when resident (do not keep it across a step),
  // a copy read from disk when on the NVMe tier. After writing every unit, call StateRestored.
  StatusOr<at::Tensor> ReadState(int kind, size_t unit);
  Status WriteState(int kind, size_t unit, const at::Tensor& src);
  // After the state was overwritten: the next step is `steps_done` + 1 and every unit is reloaded from it.
  void StateRestored(int64_t steps_done);
  void WaitForUpdates();  // every posted update has finished
  // Every posted update has finished and its write-back landed; the first update or NVMe error if any.
  Status SyncUpdates();
  const ModelLayout& layout() const { return layout_; }
  const StateTier* tier() const { return tier_.get(); }  // null without the NVMe tier
  const ResourceBusy& last_busy() const { return busy_; }
  const PhaseMemory& last_phase_memory() const { return phase_memory_; }  // zeros unless measured
  // With options.trace: the spans of the last step, from its start until its GPU work finished (updates it
  // posted that ran on into the next step are in the next step's trace).
  const std::vector<TraceSpan>& last_trace() const { return trace_; }
  int64_t steps_taken() const { return step_; }
  int64_t slot_loads() const { return slot_loads_; }              // host->device unit copies so far
  int64_t ring_loads() const { return ring_loads_; }              // of those, layers loaded from the weights-first ring
  int64_t edge_ring_chunks() const { return edge_ring_chunks_; }  // embedding and head chunks loaded from it
  int64_t streamed_units() const;  // units whose update streams through the device in whole-update steps
  // The schedule no longer changes but for the automatic choice's reprobes: fixed by the options, or the policy
  // has measured what it needed.
  bool schedule_settled() const;
  // The schedule from the next step on (tests alternate schedules with it); weights first needs a trainer made
  // with it allowed (its ring).
  void set_weights_first(WeightsFirst mode);
  int64_t pinned_bytes() const { return queue_->pinned_bytes(); }  // page-locked host memory (CUDA)
  int64_t parked_bytes() const;  // host memory holding parked layer inputs (checkpoints_on_host)

 private:
  at::Tensor ForwardTrunk(const at::Tensor& ids, const RopeTables& rope, std::vector<at::Tensor>* parked);
  void EnsureLoaded(int64_t layer);  // issue the load of `layer` into its slot unless it is there
  void Prefetch(int64_t layer);      // the same, only when its update has finished (never waits)
  // Waits for every task posted under the worker id `unit`; the trace names the wait `why` + its unit number, or
  // `what` when given (a weights-only pass: WeightsPassName).
  void WaitForUnit(size_t unit, const char* why, const std::string& what = "");
  at::Tensor SlotView(int64_t layer);  // the slot view holding `layer`'s weights
  void LoadEdgeUnit(bool head);        // the embedding or the head buffer
  // The RoPE tables for `seq_len`, built on the first step of that length and kept on the device: building them
  // takes ATen's CPU thread pool, which the update's threads hold, and made each step start ~50 ms late.
  const RopeTables& Rope(int64_t seq_len);
  at::Tensor LandingBuffer(size_t unit);
  void LandGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last);
  void PostUpdate(size_t unit, double lr, float grad_scale, int64_t step);
  // AdamW over elements [begin, begin + n) of `unit`; master, exp_avg and exp_avg_sq point at element `begin`.
  // With `weights_only_out` (element `begin`): the weights-only pass, writing only the bf16 weights there.
  void UpdateRange(size_t unit, int64_t begin, int64_t n, float* master, float* exp_avg, float* exp_avg_sq,
                   const at::Tensor& grad, const AdamWStepArgs& args, c10::BFloat16* weights_only_out = nullptr);
  AdamWStepArgs UnitArgs(double lr, float grad_scale, int64_t step) const;
  void TraceUpdate(const std::string& name, int64_t took_ns);  // an update task's span (options.trace)
  // Weights first (see WeightsFirst): which units may, whether this step's updates do, and the weights-only passes.
  struct Range {
    int64_t begin, n;  // elements [begin, begin + n) of a unit
  };
  bool HostHeld(size_t unit) const;
  bool WeightsFirstEligible(size_t unit) const;      // a host-held layer
  bool EdgeWeightsFirstEligible(size_t unit) const;  // the embedding or the head, host-held
  int64_t EdgeChunks(size_t unit) const;             // ring buffers an edge unit's weights take
  Range EdgeChunk(size_t unit, int64_t chunk) const;
  bool ChooseWeightsFirst();
  bool PolicyChooses() const;                     // the automatic choice decides (WeightsFirstPolicy), not the options
  void MakeWeightRing();                          // window + 1 page-locked buffers of the largest layer
  void PostUpdates(double lr, float grad_scale);  // every unit's, after the global norm (clipping)
  // The weights-only pass of layer `unit` (chunk -1; tracked by the worker as EarlyUnit) or of chunk `chunk` of the
  // embedding or the head (EdgeChunkUnit) into ring ticket `ticket`.
  void PostWeightsOnly(size_t unit, int64_t chunk, const AdamWStepArgs& args, int64_t ticket);
  StepStats RunStep(const std::vector<MicroBatch>& micro_batches);  // Step's body: may throw
  double RunEval(const std::vector<MicroBatch>& micro_batches);     // EvalLoss's body: may throw
  static std::string WeightsPassName(size_t unit, int64_t chunk);
  size_t EarlyUnit(size_t unit) const { return layout_.units.size() + unit; }
  size_t EdgeChunkUnit(bool head, int64_t chunk) const {
    return 2 * layout_.units.size() + static_cast<size_t>((head ? edge_chunks_max_ : 0) + chunk);
  }
  bool LoadReady(int64_t layer);  // the update the layer's next load waits for has finished
  void CancelWeightRing();        // no forward will read what waits in the ring: fills go on, loads use staging
  at::Tensor* HostState(int kind, size_t unit, StateArray* array);  // null when the NVMe tier holds it
  bool OnTier(size_t unit) const { return tier_ && tier_index_[unit] >= 0; }
  bool Resident(size_t unit) const { return unit >= 1 && unit <= static_cast<size_t>(opts_.resident_layers); }
  // A unit whose state streams (device_update_share) is updated through the device in whole-update steps only: a
  // step going weights first updates it on the CPU with the other host layers (StreamCapable: its state is
  // page-locked either way).
  bool StreamCapable(size_t unit) const { return unit < streamed_.size() && streamed_[unit]; }
  bool Streamed(size_t unit) const { return StreamCapable(unit) && !weights_first_step_; }
  // The worker holding the unit's latest task (a streamed unit's moves between the two with the step's schedule),
  // and the one a new task of this step goes to (which then holds the latest).
  UpdateWorker& WorkerFor(size_t unit) { return on_stream_worker_[unit] ? *stream_worker_ : *worker_; }
  UpdateWorker& PostWorker(size_t unit);
  void WaitAllWorkers();
  void LandResidentGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last);
  void UpdateResident(size_t unit, const AdamWStepArgs& args);
  void TakeWorkerErrors();  // the first error of any update worker into update_error_ (sticky)
  void CheckUpdates();      // throws the first failed update's error (sticky: the state is no longer trustworthy)
  void Init();
  at::Tensor Park(const at::Tensor& x, int64_t index);                 // returns what the backward unparks (or x)
  void Unpark(int64_t layer, const at::Tensor& parked);                // issues the copy back to the device
  at::Tensor ParkedOnDevice(int64_t layer, const at::Tensor& parked);  // where Unpark puts it
  int ParkedSlot(int64_t layer) const { return static_cast<int>(opts_.window + 2 + layer % 2); }

  ModelConfig cfg_;
  ModelLayout layout_;
  SlidingOptions opts_;
  at::TensorOptions device_opts_;  // compute dtype on the device
  bool on_cuda_ = false;
  SimdLevel simd_;
  int64_t accum_ = 1;

  // Host state, one flat buffer per unit (see ParamLayout). The arrays the NVMe tier holds are empty here and
  // live in tier_'s files: every unit's, or the last layers' (tier_index_: a unit's index in the tier, or -1).
  ModelParams master_, exp_avg_, exp_avg_sq_;
  std::unique_ptr<StateTier> tier_;
  std::vector<int64_t> tier_index_;
  std::string update_error_;               // the first failed update
  std::vector<at::Tensor> staging_;        // compute-dtype weights the forward loads (aliases master_ in fp32)
  std::vector<at::Tensor> grad_host_;      // returned gradients that cannot land in staging_ (fp32, accumulation)
  std::vector<at::Tensor> grad_accum_;     // fp32 sums over micro-batches (gradient accumulation only)
  std::vector<double> unit_sqnorm_;        // squared L2 norms computed on the host (accumulation only)
  std::vector<at::Tensor> device_sqnorm_;  // squared L2 norms computed on the device (no accumulation)

  // Device state. Resident units (layers [0, resident_layers)): their weights, fp32 master and moments, the
  // gradient held until the update, its fp32 sum and norm under accumulation; undefined for the others.
  std::vector<at::Tensor> dev_weights_, dev_master_, dev_exp_avg_, dev_exp_avg_sq_, dev_grad_, dev_grad_accum_,
      dev_norm_;
  std::vector<at::Tensor> slots_;      // [window] flat buffers sized for the largest layer
  std::vector<int64_t> slot_layer_;    // layer held by each slot (-1: none)
  std::vector<int64_t> slot_version_;  // weights version it was loaded at
  at::Tensor embed_dev_, head_dev_;
  int64_t embed_version_ = -1, head_version_ = -1;
  int64_t weights_version_ = 0;           // bumped by every optimizer step
  std::vector<at::Tensor> parked_host_;   // [layers] page-locked buffers the forward parks layer inputs in
  std::vector<at::Tensor> retired_host_;  // outgrown ones, page-locked while the queue lives
  at::Tensor parked_dev_[2];              // device buffers parked inputs come back into, by layer % 2
  // Weights first: the ring (made at first use), each layer's ticket while its next weights wait there (-1:
  // load from staging).
  std::unique_ptr<WeightRing> weight_ring_;
  std::vector<int64_t> ring_ticket_;
  int64_t edge_ticket_[2] = {-1, -1};  // the embedding's and the head's first chunk's ticket (-1: from staging)
  int64_t edge_chunks_max_ = 0;        // chunks of the larger edge unit (worker ids reserved for each edge)
  int64_t ring_loads_ = 0;
  int64_t edge_ring_chunks_ = 0;
  WeightsFirstPolicy weights_first_policy_;  // the automatic choice, by the steps' measured times
  // The last step posted updates after its norm and the next step runs them as posted (no evaluation or wait
  // between): the policy counts only such steps.
  bool updates_posted_ = false;

  std::unique_ptr<DeviceQueue> queue_;
  std::unique_ptr<UpdateWorker> worker_;
  // Units whose update streams through the device, and the thread that waits for their gradients and enqueues
  // them (so they never queue behind CPU updates).
  std::vector<bool> streamed_;
  std::unique_ptr<UpdateWorker> stream_worker_;
  std::vector<bool> on_stream_worker_;   // by unit (and worker id): its latest task went to stream_worker_
  bool weights_first_step_ = false;      // this step's updates go weights first (chosen before its gradients land)
  double streamed_per_cpu_element_ = 0;  // streamed elements per element the CPU updates in a whole update
  std::atomic<int64_t> update_ns_{0};
  std::atomic<int64_t> whole_adamw_ns_{0};  // of update_ns_: whole AdamW updates alone (no accumulation, no passes)
  std::atomic<int64_t> weights_only_ns_{0};
  std::atomic<int64_t> nvme_wait_ns_{0};
  ResourceBusy busy_;
  PhaseMemory phase_memory_;
  std::vector<TraceSpan> trace_;          // the last step's timeline (options.trace)
  std::vector<TraceSpan> pending_trace_;  // spans since then; update tasks append from the worker thread
  std::mutex trace_mu_;
  int64_t step_ = 0;
  int64_t slot_loads_ = 0;
  int64_t planned_tokens_ = 0;  // micro-batch tokens the memory plan allows (0: unplanned)
  int64_t rope_seq_len_ = -1;   // the length rope_ holds tables for
  RopeTables rope_;
};

}  // namespace slide
