// SlidingTrainer: trains a model whose layers do not all fit on the device. The device holds a window of
// layer slots plus the embedding and head; fp32 master weights, AdamW moments, the compute-dtype weights the
// next forward loads, and returned gradients live on the host. A step runs
//   forward   embedding, then layer i in slot i % window (loaded from the host), keeping each layer's input;
//   head      final norm + chunked LM head + CE, forward and backward together;
//   backward  layers in reverse: reload weights, recompute the layer under autograd from its saved input,
//             backpropagate, return the flat gradient to the host;
//   transfers H2D loads, D2H gradient returns and compute run on their own CUDA streams (DeviceQueue), so
//             layer i+1 loads while layer i computes and gradients stream out during the backward;
//   update    per unit as gradients land, or after the global norm under exact clipping (UpdateScheduler).
// The trainer orchestrates four parts, one concern each:
//   UnitStore        every unit's state and its placement (resident, host, streamed, NVMe tier)   unit_store.h
//   SlotWindow       the device's slots, edge buffers and parked layer inputs                     slot_window.h
//   UpdateScheduler  update workers, the weights-first ring and policy, what each load waits for  update_scheduler.h
//   StepMeter        busy times, phase memory, the step's trace                                   step_meter.h
// The device may be the CPU itself (tests and CI run the whole schedule that way).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/memory/memory_plan.h"
#include "engine/optim/cpu_adamw.h"
#include "engine/quant/nf4_unit.h"
#include "engine/runtime/reference_trainer.h"
#include "engine/runtime/sliding_options.h"
#include "engine/runtime/step_meter.h"

namespace slide {

struct ResolvedTrainer;  // trainer_resolver.h

// INVALID_ARGUMENT naming what the options contradict (dtype, window, resident layers, tier, streamed share).
Status ValidateSlidingOptions(const SlidingOptions& options, const ModelLayout& layout);
class AdapterStore;
class DeviceQueue;
class SlotWindow;
class StateTier;
class UnitStore;
class UpdateScheduler;

class SlidingTrainer {
 public:
  // Copies the weights. With options.nvme set the tier is opened here (a failure throws); Create reports it as a
  // status instead, or pass a tier opened for this layout.
  SlidingTrainer(ModelConfig cfg, const ModelParams& master_fp32, SlidingOptions options,
                 std::unique_ptr<StateTier> tier = nullptr);
  // Adopts the buffers when they already are fp32 on the host (no second copy of a large model).
  // With options.nf4_base, `nf4_layers` may hold the decoder layers already quantised (QuantizeNf4Unit; their units
  // in master_fp32 undefined): a large base is then never whole in the compute dtype. Empty: the store quantises.
  SlidingTrainer(ModelConfig cfg, ModelParams&& master_fp32, SlidingOptions options,
                 std::unique_ptr<StateTier> tier = nullptr, std::vector<Nf4Unit> nf4_layers = {});
  // Opens the NVMe tier `options` asks for (null for mode none): the disk is reserved here.
  static StatusOr<std::unique_ptr<StateTier>> OpenTier(const ModelLayout& layout, const SlidingOptions& options);

  // Builds the trainer a resolution planned (ResolveTrainer, trainer_resolver.h: a job that cannot fit was refused
  // there, with the numbers, before anything large is allocated); opens its NVMe tier. Later micro-batches larger
  // than planned are refused by Step.
  static StatusOr<std::unique_ptr<SlidingTrainer>> Create(ModelConfig cfg, ModelParams&& master_fp32,
                                                          const ResolvedTrainer& resolved,
                                                          std::vector<Nf4Unit> nf4_layers = {});
  // ResolveTrainer(cfg, options, budget), then Create; `plan` (optional) gets the plan.
  static StatusOr<std::unique_ptr<SlidingTrainer>> Create(ModelConfig cfg, ModelParams&& master_fp32,
                                                          SlidingOptions options, PlanRequest budget,
                                                          MemoryPlan* plan = nullptr);
  ~SlidingTrainer();

  // One optimizer step over `micro_batches` (accumulated). Its errors come back as a status: bad micro-batches
  // (shape, a token id or target outside the vocabulary, more tokens than planned) as INVALID_ARGUMENT before
  // anything runs; a failed update or NVMe transfer with its code, sticky; device or host memory exhausted as
  // RESOURCE_EXHAUSTED. Nothing thrown inside the trainer, on this thread or an update worker's, leaves it. After an
  // error other than bad input the trainer is not stepped again (the job fails).
  StatusOr<StepStats> Step(const std::vector<MicroBatch>& micro_batches);
  // Mean token loss over `micro_batches` with the current weights (forward only, sliding like a step).
  StatusOr<double> EvalLoss(const std::vector<MicroBatch>& micro_batches);

  // The fp32 master after every posted update has finished (a copy). Not in adapter mode.
  ModelParams Master();
  // Adapter mode: a copy of the frozen base (compute dtype, CPU) with every layer's adapter merged into its
  // projections (W + scale B A, taken in fp32 and rounded once), for an export of the merged model.
  ModelParams MergedWeights() const;
  // Adapter mode (options.adapter): the adapters on the device; null otherwise.
  const AdapterStore* adapters() const { return adapters_.get(); }
  // The units whose state a checkpoint holds: the model's units, or in adapter mode each layer's adapter (their
  // state fp32, read as a copy from the device).
  size_t state_units() const;
  // The optimizer state, for checkpoints: `kind` 0 master, 1 exp_avg, 2 exp_avg_sq of `unit`, StateShapeOf
  // (fp32 [numel], the moments of adamw_8bit bytes laid out by MomentLayout). Call SyncUpdates first. Reading gives the
  // host buffer itself when resident (do not keep it across a step), a copy read from disk when on the NVMe tier. After
  // writing every unit, call StateRestored.
  StatusOr<at::Tensor> ReadState(int kind, size_t unit);
  StatusOr<StateShape> StateShapeOf(int kind, size_t unit) const;
  OptimizerKind optimizer() const { return opts_.train.optimizer; }
  Status WriteState(int kind, size_t unit, const at::Tensor& src);
  // After the state was overwritten: the next step is `steps_done` + 1 and every unit is reloaded from it.
  void StateRestored(int64_t steps_done);
  void WaitForUpdates();  // every posted update has finished
  // Every posted update has finished and its write-back landed; the first update or NVMe error if any.
  Status SyncUpdates();
  const ModelLayout& layout() const { return layout_; }
  const StateTier* tier() const;  // null without the NVMe tier
  const ResourceBusy& last_busy() const { return meter_.busy(); }
  const PhaseMemory& last_phase_memory() const { return meter_.phase_memory(); }  // zeros unless measured
  // With options.trace: the spans of the last step, from its start until its GPU work finished (updates it
  // posted that ran on into the next step are in the next step's trace).
  const std::vector<TraceSpan>& last_trace() const { return meter_.trace(); }
  int64_t steps_taken() const { return step_; }
  int64_t slot_loads() const { return slot_loads_; }  // host->device unit copies so far
  int64_t ring_loads() const;                         // of those, layers loaded from the weights-first ring
  int64_t edge_ring_chunks() const;                   // embedding and head chunks loaded from it
  int64_t streamed_units() const;  // units whose update streams through the device in whole-update steps
  // The schedule no longer changes but for the automatic choice's reprobes: fixed by the options, or the policy
  // has measured what it needed.
  bool schedule_settled() const;
  // The schedule from the next step on (tests alternate schedules with it); weights first needs a trainer made
  // with it allowed (its ring).
  void set_weights_first(WeightsFirst mode);
  int64_t pinned_bytes() const;  // page-locked host memory (CUDA)
  int64_t parked_bytes() const;  // host memory holding parked layer inputs (checkpoints_on_host)

 private:
  // Step's and EvalLoss's bodies on checked micro-batches: LibTorch may throw in them (out of memory), which the
  // callers turn into statuses.
  StatusOr<StepStats> RunStep(const std::vector<MicroBatch>& micro_batches, int64_t valid_targets);
  double RunEval(const std::vector<MicroBatch>& micro_batches, int64_t valid_targets);
  // Embedding and layers without autograd, keeping each layer's input in `parked` when given.
  // Adapter mode: dropout in a step's forward (parked given), the masks of `micro_batch` of this step.
  at::Tensor ForwardTrunk(const at::Tensor& ids, const RopeTables& rope, std::vector<at::Tensor>* parked,
                          int64_t micro_batch);
  // The head's loss forward and backward at once; returns the gradient of the trunk's output.
  at::Tensor HeadBackward(const at::Tensor& x, const at::Tensor& targets, double normalizer,
                          const at::Tensor& embed_leaf, const at::Tensor& head_leaf, at::Tensor& loss_sum);
  // Layer `layer`'s recompute and backward from its parked input (its weights loaded); lands its gradient and
  // returns the gradient of its input.
  at::Tensor LayerBackward(int64_t layer, std::vector<at::Tensor>& parked, at::Tensor dx, const RopeTables& rope,
                           bool first, bool last, int64_t micro_batch);
  // Adapter mode: the dropout a forward applies (none outside training steps) and its masks' seed, as the LoRA
  // reference trainer draws them.
  double AdapterDropout(bool training) const;
  uint64_t DropoutSeed(int64_t micro_batch, int64_t layer) const;
  void EnsureLoaded(int64_t layer);  // issue the load of `layer` into its slot unless it is there
  void Prefetch(int64_t layer);      // the same, only when its update has finished (never waits)
  void LoadEdgeUnit(bool head);      // the embedding or the head buffer

  ModelConfig cfg_;
  ModelLayout layout_;
  SlidingOptions opts_;
  at::TensorOptions device_opts_;  // compute dtype on the device
  bool on_cuda_ = false;
  SimdLevel simd_;
  StepMeter meter_;
  // Built queue, units, window, updates; torn down (~SlidingTrainer) updates first (its workers stop, streamed
  // write-backs land), then the queue (its streams), then the memory (each page-locked buffer unlocked as it goes).
  std::unique_ptr<DeviceQueue> queue_;
  std::unique_ptr<UnitStore> units_;
  std::unique_ptr<SlotWindow> window_;
  std::unique_ptr<UpdateScheduler> updates_;
  std::unique_ptr<AdapterStore> adapters_;  // adapter mode only
  int64_t step_ = 0;
  int64_t slot_loads_ = 0;
  int64_t planned_tokens_ = 0;  // micro-batch tokens the memory plan allows (0: unplanned)
};

}  // namespace slide
