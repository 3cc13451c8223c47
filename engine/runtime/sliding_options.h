// SlidingOptions: how a sliding trainer is built and scheduled (window, where layer inputs park, resident layers,
// the NVMe tier, streamed updates, weights first). ResolveTrainer (trainer_resolver.h) derives them from a job's
// knobs and budgets; tests and benchmarks may set them directly.
#pragma once

#include <cstdint>

#include <optional>

#include "engine/io/state_tier.h"
#include "engine/model/lora.h"
#include "engine/runtime/reference_trainer.h"

namespace slide {

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

// How an NF4 base is stored (SlidingOptions::nf4_base).
struct Nf4BaseOptions {
  bool double_quant = true;  // the block scales 8-bit as well (bitsandbytes' compress_statistics; QLoRA's default)
};

struct SlidingOptions {
  TrainerOptions train;              // optimizer, schedule, clipping, compute dtype (bf16|fp32), device
  int64_t window = 2;                // layer slots on the device (>= 1)
  bool checkpoints_on_host = false;  // layer inputs parked in host memory instead of on the device
  int64_t device_budget_bytes = 0;   // > 0 on CUDA: the caching allocator may not reserve more than this
  bool trace = false;                // keep each step's timeline (last_trace)
  StateTierOptions nvme{};           // mode none: all optimizer state in host memory
  // Layers [0, resident_layers) stay on the device with their fp32 master, moments (either optimizer) and gradient, and
  // are updated there by the AdamW kernel (bit-equal to the CPU update): they never load, never return a gradient and
  // cost the CPU update nothing. Not with the NVMe tier. The planner chooses it (PlanRequest).
  int64_t resident_layers = 0;
  // Of the layers left on the host, this share (spread evenly over them in forward order) is updated on the
  // device: chunks of the fp32 state and the gradient stream up, the AdamW kernel runs, the results stream back,
  // while the CPU updates the others, so the copy engines add their bandwidth to the CPU's. bf16 compute, no NVMe
  // tier. 0: every host unit updates on the CPU.
  double device_update_share = 0;
  // Streamed layers stream in weights-first steps too, their whole update beside the other host layers'
  // weights-only passes (which they then skip); off: such steps update them on the CPU like the other host layers.
  bool stream_in_weights_first = false;
  int64_t device_update_chunk = int64_t(2) << 20;  // elements per ring buffer (3 buffers, 18 bytes per element)
  int64_t DeviceUpdateRingBytes() const { return device_update_share > 0 ? 3 * device_update_chunk * 18 : 0; }
  // Layers eligible: host-held (not resident or on the NVMe tier; streamed layers only with stream_in_weights_first
  // off); bf16 compute with clipping only.
  WeightsFirst weights_first = WeightsFirst::kAuto;
  // The host-held fp32 master, moments and gradient sums in their own mappings (HostArray), advised for
  // transparent huge pages; off: advised against them (small pages even where THP is "always").
  bool host_huge_pages = true;
  // Measure each phase's peak device memory in every step (last_phase_memory; CUDA only). Restarts the caching
  // allocator's peak counter at each phase, so the process-wide peak it keeps is lost (benchmarks and tests).
  bool measure_phase_memory = false;
  // Set: adapter mode. The base is frozen: the host keeps its compute-dtype weights only (no master, moments or
  // gradients) and the device trains these LoRA adapters (AdapterStore); no resident layers (a window as deep as
  // the model keeps every layer on the device), no NVMe tier, no streamed share, no weights-first pass.
  std::optional<LoraOptions> adapter{};
  // With an adapter, QLoRA: the frozen base's decoder layers kept in NF4 (engine/quant/nf4_unit.h; every projection
  // 4 bits a weight plus its block scales, norms and biases in the compute dtype), dequantised into their slot as
  // each layer loads. The embedding and the head stay in the compute dtype, as bitsandbytes leaves them.
  std::optional<Nf4BaseOptions> nf4_base{};
};

// One checkpointed state array of a unit (SlidingTrainer::StateShapeOf): fp32 [numel] but for adamw_8bit's moments.
struct StateShape {
  c10::ScalarType dtype = c10::kFloat;
  int64_t numel = 0;
  int64_t float_prefix = 0;  // a byte array's leading fp32 values (its small moments and absmax; MomentLayout)
};

// Weights first may run: asked for, or automatic on CUDA (kAuto only ever turns it on there).
inline bool WeightsFirstAllowed(const SlidingOptions& o) {
  return o.weights_first == WeightsFirst::kOn || (o.weights_first == WeightsFirst::kAuto && o.train.device.is_cuda());
}

// The share GPU jobs stream (bf16, no NVMe tier); how it was chosen: bench/RESULTS.md, "Streamed updates" (fp32
// moments) and "8-bit AdamW on the GPU" (8-bit moments: at 8B batch 16, 0.5 gave the shortest step of 0, 0.5 and
// 0.7; a streamed element moves 16 bytes over PCIe against fp32's 28, so a larger share pays).
inline constexpr double kDefaultDeviceUpdateShare = 0.3;
inline constexpr double kDefaultDeviceUpdateShare8bit = 0.5;

// The share slided's jobs stream when none is asked for: full fine-tuning in bf16 on a GPU with the state in host
// memory streams the default share of its optimizer; nothing else streams (adapters have no host-held state).
inline double DefaultDeviceUpdateShare(const SlidingOptions& o) {
  if (!o.train.device.is_cuda() || o.train.compute_dtype != c10::kBFloat16 || o.nvme.mode != TierMode::kNone ||
      o.adapter)
    return 0.0;
  return o.train.optimizer == OptimizerKind::kAdamW8bit ? kDefaultDeviceUpdateShare8bit : kDefaultDeviceUpdateShare;
}

// The share a trainer built from a plan streams: none where the plan parks the layer inputs on the host (their
// copies share the PCIe link with the streamed state, and there the share slowed the step: bench/RESULTS.md).
inline double PlannedDeviceUpdateShare(double requested, bool checkpoints_on_host) {
  return checkpoints_on_host ? 0 : requested;
}

}  // namespace slide
