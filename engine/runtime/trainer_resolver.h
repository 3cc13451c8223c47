// The one mapping from what is asked of a sliding trainer to what it is built with, for the daemon's jobs, the
// benchmarks and the tests alike. `requested` carries the trainer's choices (device, dtype, optimizer, clipping, the
// NVMe tier, the streamed share, weights first); `budget` carries the shape and the budgets (micro-batch, sequence,
// accumulation, device and host budgets, window (0: chosen), layer-input placement, resident layers (-1: as many as
// fit)). What the planner needs that follows from `requested` (the model, the compute dtype, the loss chunk, the
// tier's arrays, ring and layers, the streamed ring, the weights-first ring) is filled in here and nowhere else.
#pragma once

#include "engine/common/status.h"
#include "engine/memory/memory_plan.h"
#include "engine/runtime/sliding_options.h"

namespace slide {

struct ResolvedTrainer {
  PlanRequest request;         // what the planner was asked last
  MemoryPlan plan;             // what it answered: the window, the placement, resident layers, the totals
  SlidingOptions options;      // `requested` with the plan applied: window, placement, resident layers, share, tier
  int64_t planned_tokens = 0;  // micro_batch x seq_len: a step with more tokens would outgrow the plan
};

// RESOURCE_EXHAUSTED with needed against available when it cannot fit; INVALID_ARGUMENT for contradictory asks.
StatusOr<ResolvedTrainer> ResolveTrainer(const ModelConfig& cfg, SlidingOptions requested, PlanRequest budget);

}  // namespace slide
