// The memory planner: from the model shape, batch, sequence and budgets, decide how many layer slots the device
// holds and where layer inputs are kept, and account for every large buffer of a sliding-window job on the
// device and on the host. A job that cannot fit is refused before it starts, with the numbers.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "engine/common/status.h"
#include "engine/memory/checkpoint_placement.h"
#include "engine/model/config.h"
#include "engine/optim/moment_layout.h"

namespace slide {

struct PlanRequest {
  ModelConfig model;
  int64_t micro_batch = 1;
  int64_t seq_len = 1024;
  int64_t grad_accum = 1;
  c10::ScalarType compute_dtype = c10::kBFloat16;
  int64_t lm_head_chunk_tokens = 1024;
  int64_t device_budget_bytes = 24ll << 30;
  int64_t host_budget_bytes = 0;  // 0: not checked
  int64_t window = 0;             // 0: the planner chooses
  CheckpointPlacement checkpoints = CheckpointPlacement::kAuto;
  int64_t device_reserved_bytes = 1ll << 30;  // CUDA context, cuBLAS workspaces, allocator slack
  // The NVMe tier: which optimizer arrays live on disk, and the host ring its I/O goes through.
  bool moments_on_nvme = false;
  bool master_on_nvme = false;
  int64_t nvme_ring_bytes = 0;
  // The tier holds every unit's state (-1) or only the last k layers' (StateTierOptions); 0: the fewest last layers
  // (at least 1) with which the host side fits host_budget_bytes less a sixteenth (the plans are estimates, within
  // ~1 GiB of the peak measured at 8B), else every unit's. Needs a host budget.
  int64_t nvme_layers = -1;
  // Layers [0, k) kept on the device with their whole optimizer state (weights, fp32 master, both moments, the
  // gradient held until the update) and updated there: no load, no gradient copy, no CPU update for them.
  // 0: none; -1: as many as the budget holds after the window (the window then defaults to 2 slots, which
  // residency uses better than more slots would; a sixteenth of the budget is left free); not with the NVMe tier.
  int64_t resident_layers = 0;
  int64_t streamed_ring_bytes = 0;  // device buffers of the streamed updates (SlidingOptions::device_update_share)
  // The weights-first ring may be used (SlidingOptions::weights_first; bf16 compute with clipping): window + 1
  // page-locked layer buffers of the compute dtype, when any layer is held on the host outside the NVMe tier.
  bool weights_first = false;
  // How the host keeps the AdamW moments: fp32 (8 bytes a parameter) or adamw_8bit (about 2 + 2/256 * 4).
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  // > 0: adapter mode (SlidingOptions::adapter) with this many adapter elements (AdapterLayout::TotalNumel). The
  // base is frozen: the host holds its compute-dtype weights only, the device the adapters' fp32 master, moments,
  // gradient and compute copy; no embedding or LM-head gradient; slots are the base's only residency, so the
  // window is the widest that fits.
  int64_t adapter_numel = 0;
  bool adapter_dropout = false;  // the masked copies of each targeted projection's input live through the backward
  // Adapter mode over an NF4 base (SlidingOptions::nf4_base): the host holds the decoder layers as NF4 arrays
  // (Nf4UnitBytes) and the device one scratch the largest layer's arrays load through.
  bool nf4_base = false;
  bool nf4_double_quant = true;
};

struct MemoryPlan {
  int64_t window = 0;
  bool checkpoints_on_host = false;
  // Device bytes.
  int64_t slot_bytes = 0;        // all layer slots
  int64_t edge_bytes = 0;        // embedding + head weights
  int64_t checkpoint_bytes = 0;  // layer inputs kept on the device (parked on the host: the 2 they come back into)
  int64_t resident_layers = 0;   // layers [0, resident_layers) live on the device with their optimizer state
  int64_t resident_bytes = 0;
  int64_t streamed_ring_bytes = 0;
  int64_t adapter_bytes = 0;      // adapter mode: the adapters' master, moments, gradient and compute copy
  int64_t nf4_scratch_bytes = 0;  // an NF4 base: the device arrays a layer load dequantises from
  int64_t peak_work_bytes = 0;    // the largest transient phase (forward, head, a layer's backward, embedding)
  // Each phase's transient, above the resident buffers and the kept layer inputs (the embedding's: above the
  // resident buffers and, when parked, the two device buffers the inputs come back into).
  int64_t forward_phase_bytes = 0, head_phase_bytes = 0, layer_phase_bytes = 0, embed_phase_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t device_total = 0;
  // Host bytes.
  int64_t master_bytes = 0;   // fp32 weights
  int64_t moments_bytes = 0;  // AdamW m and v, as `optimizer` keeps them
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  int64_t params = 0;         // the model's parameters (the host's bytes per parameter are host_total / params)
  int64_t staging_bytes = 0;  // compute-dtype weights the forward loads (gradients land here without accumulation)
  int64_t grad_bytes = 0;     // gradient landing and fp32 accumulation buffers
  int64_t host_checkpoint_bytes = 0;
  int64_t nvme_ring_bytes = 0;    // the NVMe tier's chunk buffers
  int64_t weight_ring_bytes = 0;  // the weights-first ring
  int64_t host_total = 0;
  int64_t nvme_bytes = 0;    // optimizer state on disk
  int64_t nvme_layers = -1;  // the tier's layers as planned (PlanRequest::nvme_layers; the planner's pick for 0)

  // The plan's estimate of the caching allocator's peak in each phase of a step (its reserve for the context and
  // workspaces is not the allocator's): what stays allocated (slots, edges, resident layers, the streamed ring), the
  // layer inputs' device bytes where the phase holds them, and the phase's transient.
  struct PhasePeaks {
    int64_t step_start = 0, forward = 0, head = 0, layers = 0, embedding = 0;
  };
  PhasePeaks PlannedPhasePeaks() const;

  std::string ToString() const;  // a readable table
};

StatusOr<MemoryPlan> PlanMemory(const PlanRequest& request);

std::string FormatBytes(int64_t bytes);  // "12.3 GiB"

}  // namespace slide
