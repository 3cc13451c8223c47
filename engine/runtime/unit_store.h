// UnitStore: every unit's training state, one record per unit (embedding, layers, head; see ParamLayout), and
// where that unit lives. The placement is decided once, when the trainer is built, from its options:
//   resident  layers [0, resident_layers): weights, fp32 master and moments on the device, updated there
//   host      fp32 master and moments in host memory (own mappings, huge pages), updated by the CPU
//   streamed  a host unit whose state is page-locked so that whole-update steps can stream it through the
//             device's AdamW (device_update_share); a weights-first step updates it on the CPU like the others
//   tier      the moments (and the master, when the tier holds it) on the NVMe tier, read ahead per update
//   frozen    adapter mode (SlidingOptions::adapter): the compute-dtype weights alone, never updated; with an NF4
//             base (QLoRA) a decoder layer holds its NF4 arrays instead (Unit::nf4) and no staging buffer
// Every non-resident unit has a staging buffer: the compute-dtype weights the forward loads (the master itself
// for fp32 compute on the CPU). The store allocates; it does not schedule (UpdateScheduler) or move weights to the
// device (SlotWindow).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/common/status.h"
#include "engine/io/state_tier.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/optim/moment_layout.h"
#include "engine/quant/nf4_unit.h"
#include "engine/runtime/sliding_options.h"

namespace slide {

class DeviceQueue;

enum class Placement { kResident, kHost, kStreamed, kTier, kFrozen };

// The NVMe tier a store opens for `options` (mode none: unused). A tiered unit's arrays are its moments' buffers
// (MomentLayout) in 4-byte words, and the master's numel when the tier holds it. With adamw_8bit a unit's moments
// travel whole, one chunk (its blocks are requantised together), so the chunk grows to the largest unit's moment
// buffer, block-aligned, and the ring keeps at most 3 of them; the ring the planner counts is this one's
// (StateTierRingBytes).
StateTierOptions TierOptionsFor(const ModelLayout& layout, const SlidingOptions& options);

struct Unit {
  Placement placement = Placement::kHost;
  int64_t tier_index = -1;  // the unit's index in the NVMe tier (kTier), else -1
  // Host: fp32 master (undefined when resident or when the tier holds it), moments (laid out by the store's
  // MomentLayout: fp32 [numel], or adamw_8bit's bytes; undefined when resident or on the tier), the weights the forward
  // loads, the gradient's landing buffer when it is not the staging buffer, the fp32 gradient sum (accumulation) and
  // its squared norm computed on the host.
  at::Tensor master;               // fp32 [numel]
  at::Tensor exp_avg, exp_avg_sq;  // MomentLayout::dtype() [MomentLayout::numel()]
  at::Tensor staging;              // compute dtype [numel]
  at::Tensor grad_landing;         // compute dtype [numel], allocated at first need
  at::Tensor grad_sum;             // fp32 [numel], allocated at the first accumulating step
  double sqnorm = 0;
  // A frozen decoder layer of an NF4 base: its arrays, page-locked (staging is then undefined).
  std::shared_ptr<const Nf4Unit> nf4;
  // Device, resident units only: weights (the master itself for fp32 compute), fp32 master and moments, the
  // gradient held until the update, its fp32 sum under accumulation and that sum's norm.
  at::Tensor dev_weights, dev_master, dev_exp_avg, dev_exp_avg_sq, dev_grad, dev_grad_sum, dev_norm;

  bool resident() const { return placement == Placement::kResident; }
  bool on_tier() const { return placement == Placement::kTier; }
  bool stream_capable() const { return placement == Placement::kStreamed; }
  // State in host memory (host or streamed): where the CPU's weights-only pass can run.
  bool host_held() const { return placement == Placement::kHost || placement == Placement::kStreamed; }
};

// Checkpoint state kinds (ReadState/WriteState).
enum class StateKind { kMaster = 0, kExpAvg = 1, kExpAvgSq = 2 };

class UnitStore {
 public:
  // Takes the fp32 host master (moved unit by unit into its placement; the loaded copy is released as it goes) and
  // the NVMe tier options.nvme asks for (opened here when null; a failure throws). `queue` page-locks the host
  // buffers the device copies from. The options were checked (ValidateSlidingOptions).
  // Adapter mode with options.nf4_base: `nf4_layers` holds the decoder layers already quantised (their units in
  // `master_fp32` undefined), or is empty and the store quantises the loaded layers itself, one at a time.
  UnitStore(ModelParams&& master_fp32, const SlidingOptions& options, DeviceQueue& queue,
            std::unique_ptr<StateTier> tier, std::vector<Nf4Unit> nf4_layers = {});
  // Opens the NVMe tier `options` asks for (null for mode none): the disk is reserved here.
  static StatusOr<std::unique_ptr<StateTier>> OpenTier(const ModelLayout& layout, const SlidingOptions& options);

  const ModelLayout& layout() const { return layout_; }
  size_t size() const { return units_.size(); }
  size_t head_index() const { return units_.size() - 1; }
  Unit& operator[](size_t u) { return units_[u]; }
  const Unit& operator[](size_t u) const { return units_[u]; }
  StateTier* tier() const { return tier_.get(); }
  // How a host-held unit's moments are laid out (options.train.optimizer); resident and tier units keep fp32.
  const MomentLayout& moments(size_t u) const { return moments_[u]; }
  int64_t largest_layer_numel() const;
  int64_t streamed_units() const;
  // Streamed elements per element the CPU updates in a whole update (0 when nothing streams).
  double streamed_per_cpu_element() const { return streamed_per_cpu_element_; }

  // Where a unit's returned gradient lands. With bf16 compute and no accumulation that is its own staging buffer:
  // the staging weights are not read again until the update has overwritten them with the new weights (AdamW
  // reads the gradient and writes the bf16 weight element by element in place), which saves 2 bytes a parameter.
  at::Tensor LandingBuffer(size_t unit, bool accumulating);
  // The fp32 gradient sums accumulation needs (allocated whole before kept: a failed allocation leaves none).
  void EnsureGradSums();
  bool has_grad_sums() const { return has_grad_sums_; }
  // The gradient a unit's update reads: its sum under accumulation, else its landing buffer.
  at::Tensor UpdateGradient(size_t unit, bool accumulating);

  // Checkpoint state, StateShapeOf(kind, unit): the host buffer itself when held in host memory (do not keep it
  // across a step), a copy read from the tier or the device otherwise.
  StateShape StateShapeOf(StateKind kind, size_t unit) const;
  StatusOr<at::Tensor> ReadState(StateKind kind, size_t unit);
  Status WriteState(StateKind kind, size_t unit, const at::Tensor& src);
  // After the state was overwritten: every unit's weights (staging, a resident unit's device weights) from its
  // master, rounded as AdamW writes them.
  void RefreshWeights();

 private:
  at::Tensor* HostState(StateKind kind, size_t unit, StateArray* array);  // null when the NVMe tier holds it
  void StoreFrozen(ModelParams&& loaded, std::vector<Nf4Unit> nf4_layers);

  ModelLayout layout_;
  const SlidingOptions& options_;
  DeviceQueue& queue_;
  std::unique_ptr<StateTier> tier_;
  std::vector<Unit> units_;
  std::vector<MomentLayout> moments_;  // per unit
  bool has_grad_sums_ = false;
  double streamed_per_cpu_element_ = 0;
};

}  // namespace slide
