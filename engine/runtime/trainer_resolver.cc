#include "engine/runtime/trainer_resolver.h"

#include "engine/runtime/unit_store.h"

namespace slide {

StatusOr<ResolvedTrainer> ResolveTrainer(const ModelConfig& cfg, SlidingOptions requested, PlanRequest budget) {
  PlanRequest& r = budget;
  r.model = cfg;
  r.compute_dtype = requested.train.compute_dtype;
  r.lm_head_chunk_tokens = requested.train.loss.chunk_tokens;
  // The weights-first ring is counted where it can be used: bf16 compute with clipping (SlidingOptions).
  r.weights_first = WeightsFirstAllowed(requested) && requested.train.max_grad_norm > 0;
  const StateTierOptions& tier = requested.nvme;
  r.moments_on_nvme = tier.mode != TierMode::kNone;
  r.master_on_nvme = tier.mode == TierMode::kMomentsAndMaster;
  r.nvme_ring_bytes = r.moments_on_nvme ? StateTierRingBytes(TierOptionsFor(BuildModelLayout(cfg), requested)) : 0;
  r.nvme_layers = r.moments_on_nvme ? tier.layers : -1;
  if (r.moments_on_nvme) r.resident_layers = 0;  // the tier keeps every unit's state on disk
  r.optimizer = requested.train.optimizer;
  // Resident 8-bit units (the device kernel) are planned as fp32 ones are (the plan counts their moments at fp32's
  // bytes, an upper bound); streamed ones as asked (DefaultDeviceUpdateShare for jobs).
  if (requested.adapter) {  // a frozen base: nothing resident, streamed or weights first (ValidateSlidingOptions)
    r.adapter_numel = BuildAdapterLayout(cfg, *requested.adapter).TotalNumel();
    r.adapter_dropout = requested.adapter->dropout > 0;
    r.nf4_base = requested.nf4_base.has_value();
    if (requested.nf4_base) r.nf4_double_quant = requested.nf4_base->double_quant;
    r.resident_layers = 0;
    r.weights_first = false;
    requested.device_update_share = 0;
    requested.weights_first = WeightsFirst::kOff;
  }
  r.streamed_ring_bytes = requested.DeviceUpdateRingBytes();  // after the optimizer's say on the share

  SLIDE_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(r));
  if (plan.checkpoints_on_host && r.streamed_ring_bytes > 0) {
    // Nothing streams beside parked layer inputs (PlannedDeviceUpdateShare): plan again without the streamed ring,
    // the inputs kept parked (the ring's room could otherwise tip the choice back to the device, where the share
    // would apply unplanned) and the window kept (a wider one could cost resident layers and grow the host side past
    // a budget the first plan met; with both kept the room can only go to resident layers).
    r.streamed_ring_bytes = 0;
    r.checkpoints = CheckpointPlacement::kHost;
    r.window = plan.window;
    SLIDE_ASSIGN_OR_RETURN(plan, PlanMemory(r));
  }

  ResolvedTrainer out;
  SlidingOptions& o = requested;
  o.window = plan.window;
  o.device_update_share = PlannedDeviceUpdateShare(o.device_update_share, plan.checkpoints_on_host);
  // On the CPU the device is host memory: parking its layer inputs would only copy them.
  o.checkpoints_on_host = plan.checkpoints_on_host && o.train.device.is_cuda();
  o.device_budget_bytes = r.device_budget_bytes;
  o.resident_layers = plan.resident_layers;
  if (tier.mode != TierMode::kNone && tier.layers == 0) o.nvme.layers = plan.nvme_layers;  // the fewest that fit
  out.request = r;
  out.plan = plan;
  out.options = std::move(o);
  out.planned_tokens = r.micro_batch * r.seq_len;
  return out;
}

}  // namespace slide
