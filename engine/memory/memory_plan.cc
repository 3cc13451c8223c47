#include "engine/memory/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "engine/io/state_tier.h"
#include "engine/model/param_layout.h"
#include "engine/quant/nf4_unit.h"

namespace slide {
namespace {

struct Shape {
  int64_t layers, max_layer, embed, head, tokens, hidden;
  int64_t max_nf4_layer = 0;  // an NF4 base: the largest layer's NF4 arrays
};

// Device bytes per parameter of a resident layer: its compute-dtype weights (none in fp32: they are the master),
// the fp32 master and moments, and the gradient held until the update (the fp32 sum when micro-batches accumulate).
int64_t ResidentBytesPerParam(const PlanRequest& r) {
  const int64_t e = c10::elementSize(r.compute_dtype);
  return (e == 4 ? 0 : e) + 12 + (r.grad_accum > 1 ? 4 : e);
}

// Device bytes for a given window, checkpoint placement and resident layer count.
MemoryPlan DeviceSide(const PlanRequest& r, const Shape& s, int64_t window, bool ckpt_on_host, int64_t resident) {
  const int64_t e = c10::elementSize(r.compute_dtype);
  const ModelConfig& m = r.model;
  MemoryPlan p;
  p.window = window;
  p.checkpoints_on_host = ckpt_on_host;
  p.slot_bytes = window * s.max_layer * e;
  p.edge_bytes = (s.embed + s.head) * e;
  // On the host: the two device buffers parked inputs come back into, one layer ahead of the backward.
  p.checkpoint_bytes = (ckpt_on_host ? 2 : s.layers) * s.tokens * s.hidden * e;
  p.reserved_bytes = r.device_reserved_bytes;
  p.resident_layers = resident;
  p.resident_bytes = resident * s.max_layer * ResidentBytesPerParam(r);
  p.streamed_ring_bytes = r.streamed_ring_bytes;
  const bool adapter = r.adapter_numel > 0;
  p.adapter_bytes = adapter ? r.adapter_numel * (16 + (e == 4 ? 0 : e)) : 0;
  p.nf4_scratch_bytes = adapter && r.nf4_base ? s.max_nf4_layer : 0;

  // Head phase: one chunk of logits (compute dtype, fp32, and the fp32->compute gradient copy), the fp32 and
  // compute-dtype LM-head gradient, the normed hidden states in fp32 and their gradient.
  const int64_t chunk = std::min(r.lm_head_chunk_tokens, s.tokens);
  const int64_t lm = m.vocab_size * m.hidden_size;
  // A frozen head (adapter mode) has no LM-head gradient.
  const int64_t head_phase = chunk * m.vocab_size * (e + 4 + e) + (adapter ? 0 : lm * (4 + e)) +
                             s.tokens * s.hidden * (4 + e) + (m.tie_word_embeddings || adapter ? 0 : s.embed * e);
  // Layer phase: tensors autograd keeps for one layer's backward (norm outputs, q/k/v, attention output,
  // projections, gate/up/activation/product) plus as many temporaries during backward, and the layer gradient.
  const int64_t per_token = 5 * m.hidden_size + 2 * m.q_dim() + 2 * m.kv_dim() + 4 * m.intermediate_size;
  // Adapter mode: no layer gradient, but with dropout each targeted projection's masked input (at most every
  // projection's: 3 of the hidden size for q, k and v, o's q_dim, 2 more for gate and up, down's intermediate size)
  // and its mask.
  const int64_t dropout_per_token = 2 * (5 * m.hidden_size + m.q_dim() + m.intermediate_size);
  const int64_t layer_phase = 2 * s.tokens * per_token * e + (adapter ? 0 : s.max_layer * e) +
                              2 * s.tokens * s.hidden * e + (r.adapter_dropout ? s.tokens * dropout_per_token * e : 0);
  // Forward phase: a layer's activations without autograd beside the kept inputs (0.78-0.84 of this per-token
  // count measured on one H100 box, ad69f40, bench/results/2026-12-06-h100-phase-memory.jsonl).
  const int64_t forward_phase = s.tokens * per_token * e;
  // Embedding phase: its gradient is summed in fp32 and rounded to the compute dtype, beside the LM head's share
  // already held when the weights are tied; the gradient flowing in, the recomputed output, and the incoming
  // gradient in fp32.
  const int64_t embed_phase =
      adapter ? 0 : s.embed * (4 + e) + (m.tie_word_embeddings ? lm * e : 0) + s.tokens * s.hidden * (2 * e + 4);
  // Every phase also holds small tensors the terms above leave out: the rotary tables (fp32 cos and sin), token ids,
  // targets and index workspaces, and a MiB for losses, norms and the allocator's rounding of each block.
  const int64_t small_tensors = 2 * r.seq_len * m.head_dim * 4 + s.tokens * 32 + (int64_t(1) << 20);
  p.forward_phase_bytes = forward_phase + small_tensors;
  p.head_phase_bytes = head_phase + small_tensors;
  p.layer_phase_bytes = layer_phase + small_tensors;
  p.embed_phase_bytes = embed_phase + small_tensors;
  p.peak_work_bytes = std::max({p.forward_phase_bytes, p.head_phase_bytes, p.layer_phase_bytes, p.embed_phase_bytes});
  p.device_total = p.slot_bytes + p.edge_bytes + p.checkpoint_bytes + p.peak_work_bytes + p.reserved_bytes +
                   p.resident_bytes + p.streamed_ring_bytes + p.adapter_bytes + p.nf4_scratch_bytes;
  return p;
}

// PlanRequest::nvme_layers == 0: plans with 1, 2, ... tiered layers, unchecked against the host, until one fits the
// budget less its margin; then every unit, checked as any request is.
StatusOr<MemoryPlan> PlanFewestTieredLayers(const PlanRequest& r) {
  if (r.host_budget_bytes <= 0)
    return InvalidArgument("choosing the NVMe tier's layers (nvme_layers 0) needs a host memory budget");
  const int64_t room = r.host_budget_bytes - r.host_budget_bytes / 16;
  PlanRequest each = r;
  each.host_budget_bytes = 0;
  for (each.nvme_layers = 1; each.nvme_layers <= r.model.num_layers; ++each.nvme_layers) {
    SLIDE_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(each));
    if (plan.host_total <= room) return plan;
  }
  each.nvme_layers = -1;
  each.host_budget_bytes = r.host_budget_bytes;
  return PlanMemory(each);
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1ll << 30));
  return buf;
}

StatusOr<MemoryPlan> PlanMemory(const PlanRequest& r) {
  if (r.moments_on_nvme && r.nvme_layers == 0) return PlanFewestTieredLayers(r);
  if (r.micro_batch < 1 || r.seq_len < 1 || r.grad_accum < 1 || r.lm_head_chunk_tokens < 1)
    return InvalidArgument("micro_batch, seq_len, grad_accum and lm_head_chunk_tokens must be >= 1");
  if (r.compute_dtype != c10::kBFloat16 && r.compute_dtype != c10::kFloat)
    return InvalidArgument("compute dtype must be bf16 or fp32");
  const ModelLayout layout = BuildModelLayout(r.model);
  Shape s{layout.num_layers(), 0, layout.embed().numel, layout.head().numel, r.micro_batch * r.seq_len,
          r.model.hidden_size};
  for (int64_t i = 0; i < s.layers; ++i) s.max_layer = std::max(s.max_layer, layout.layer(i).numel);
  const int64_t e_bytes = c10::elementSize(r.compute_dtype);
  int64_t nf4_layers_bytes = 0;  // an NF4 base's layers on the host
  if (r.nf4_base) {
    if (r.adapter_numel <= 0) return InvalidArgument("an NF4 base needs adapter mode");
    for (int64_t i = 0; i < s.layers; ++i) {
      const int64_t b = Nf4UnitBytes(layout.layer(i), r.nf4_double_quant, e_bytes);
      nf4_layers_bytes += b;
      s.max_nf4_layer = std::max(s.max_nf4_layer, b);
    }
  }
  if (r.window < 0 || r.window > s.layers)
    return InvalidArgument("window must be between 1 and the layer count (" + std::to_string(s.layers) + ")");

  if (r.resident_layers < -1 || r.resident_layers > s.layers)
    return InvalidArgument("resident layers must be -1 (as many as fit) or between 0 and the layer count (" +
                           std::to_string(s.layers) + ")");
  const bool adapter = r.adapter_numel > 0;
  if (adapter && (r.resident_layers > 0 || r.moments_on_nvme || r.streamed_ring_bytes > 0))
    return InvalidArgument("adapter mode has no resident layers, NVMe tier or streamed updates");
  if (r.resident_layers > 0 && r.moments_on_nvme)
    return InvalidArgument("resident layers keep their optimizer state on the device: not with the NVMe tier");
  // The units whose state the tier holds, by the tier's own rule (a count outside the model is refused there).
  StateTierOptions tier;
  tier.mode = r.moments_on_nvme ? TierMode::kMoments : TierMode::kNone;
  tier.layers = r.nvme_layers;
  SLIDE_ASSIGN_OR_RETURN(const std::vector<int64_t> tier_index, TierUnitIndex(s.layers, tier));
  const bool auto_resident = r.resident_layers == -1 && !r.moments_on_nvme && !adapter;
  const int64_t fixed_resident = std::max<int64_t>(r.resident_layers, 0);

  // Prefer: the whole model resident, then the most slots that fit, checkpoints on the device before the host.
  // With automatic residency the window stays at 2 slots (fewer if they do not fit): the memory left is better
  // spent on resident layers, which save the CPU update as well as the loads.
  const int64_t widest = r.window > 0 ? r.window : auto_resident ? std::min<int64_t>(2, s.layers) : s.layers;
  std::vector<bool> placements;
  if (r.checkpoints != CheckpointPlacement::kHost) placements.push_back(false);
  if (r.checkpoints != CheckpointPlacement::kDevice) placements.push_back(true);
  MemoryPlan best;
  bool found = false;
  MemoryPlan smallest = DeviceSide(r, s, r.window > 0 ? r.window : 1, placements.back(), fixed_resident);
  for (bool on_host : placements) {
    for (int64_t w = widest; w >= (r.window > 0 ? r.window : 1); --w) {
      MemoryPlan p = DeviceSide(r, s, w, on_host, fixed_resident);
      if (p.device_total <= r.device_budget_bytes) {
        best = p;
        found = true;
        break;
      }
    }
    if (found) break;
  }
  if (!found) {
    return ResourceExhausted(
        "the job needs " + FormatBytes(smallest.device_total) + " of device memory at its smallest (window " +
        std::to_string(smallest.window) + ", layer inputs on " + (smallest.checkpoints_on_host ? "host" : "device") +
        "), but the device budget is " + FormatBytes(r.device_budget_bytes) + ":\n" + smallest.ToString());
  }

  if (auto_resident) {
    const int64_t per_layer = s.max_layer * ResidentBytesPerParam(r);
    // A sixteenth of the budget stays free: the transient phases are estimates (measured within 2% at 8B), and
    // a resident layer too many would turn that error into an out-of-memory failure.
    const int64_t room = r.device_budget_bytes - r.device_budget_bytes / 16 - best.device_total;
    const int64_t fit = per_layer > 0 ? room / per_layer : 0;
    best = DeviceSide(r, s, best.window, best.checkpoints_on_host, std::clamp<int64_t>(fit, 0, s.layers));
  }

  // Host side: every unit not resident on the device.
  int64_t resident_numel = 0;
  for (int64_t i = 0; i < best.resident_layers; ++i) resident_numel += layout.layer(i).numel;
  const int64_t n = layout.TotalNumel() - resident_numel;
  const int64_t e = c10::elementSize(r.compute_dtype);
  int64_t tiered = 0;  // elements whose optimizer state is on the NVMe tier
  for (size_t u = 0; u < tier_index.size(); ++u)
    if (tier_index[u] >= 0) tiered += layout.units[u].numel;
  best.master_bytes = adapter ? 0 : 4 * (n - (r.master_on_nvme ? tiered : 0));
  std::vector<bool> host_moments(layout.units.size(), true);  // units whose moments the host holds
  for (size_t u = 0; u < layout.units.size(); ++u)
    host_moments[u] =
        !(u >= 1 && static_cast<int64_t>(u) <= best.resident_layers) && (tier_index.empty() || tier_index[u] < 0);
  if (adapter) std::fill(host_moments.begin(), host_moments.end(), false);
  best.moments_bytes = MomentBytes(r.optimizer, layout, host_moments);
  best.optimizer = r.optimizer;
  best.params = r.model.TotalParamCount();
  best.nvme_ring_bytes = r.moments_on_nvme ? r.nvme_ring_bytes : 0;
  std::vector<bool> tier_moments(layout.units.size(), false);  // units whose moments the tier holds
  for (size_t u = 0; u < tier_index.size(); ++u) tier_moments[u] = tier_index[u] >= 0;
  best.nvme_bytes = MomentBytes(r.optimizer, layout, tier_moments) + (r.master_on_nvme ? 4 * tiered : 0);
  best.nvme_layers = r.moments_on_nvme ? r.nvme_layers : -1;
  best.staging_bytes = r.nf4_base ? e * (s.embed + s.head) + nf4_layers_bytes : e * n;
  best.grad_bytes = adapter ? 0 : r.grad_accum > 1 ? (4 + e) * n : (r.compute_dtype == c10::kFloat ? 4 * n : 0);
  best.host_checkpoint_bytes = best.checkpoints_on_host ? s.layers * s.tokens * s.hidden * e : 0;
  int64_t ring_layers = 0;  // layers that may go weights first: on the host, outside the tier
  for (int64_t i = best.resident_layers; i < s.layers; ++i)
    ring_layers += tier_index.empty() || tier_index[1 + i] < 0 ? 1 : 0;  // empty: no tier
  const bool ring = r.weights_first && r.compute_dtype == c10::kBFloat16 && ring_layers > 0 && !adapter;
  best.weight_ring_bytes = ring ? (best.window + 1) * s.max_layer * e : 0;
  best.host_total = best.master_bytes + best.moments_bytes + best.staging_bytes + best.grad_bytes +
                    best.host_checkpoint_bytes + best.nvme_ring_bytes + best.weight_ring_bytes;
  if (r.host_budget_bytes > 0 && best.host_total > r.host_budget_bytes) {
    return ResourceExhausted("the job needs " + FormatBytes(best.host_total) +
                             " of host memory, but the host budget is " + FormatBytes(r.host_budget_bytes) + ":\n" +
                             best.ToString());
  }
  return best;
}

MemoryPlan::PhasePeaks MemoryPlan::PlannedPhasePeaks() const {
  const int64_t steady = slot_bytes + edge_bytes + resident_bytes + streamed_ring_bytes + nf4_scratch_bytes;
  const int64_t inputs = steady + checkpoint_bytes;
  return {.step_start = steady,
          .forward = inputs + forward_phase_bytes,
          .head = inputs + head_phase_bytes,
          .layers = inputs + layer_phase_bytes,
          // The inputs kept on the device are gone by then; the two buffers parked ones come back into are not.
          .embedding = steady + (checkpoints_on_host ? checkpoint_bytes : 0) + embed_phase_bytes};
}

std::string MemoryPlan::ToString() const {
  std::string out;
  auto row = [&](const char* name, int64_t bytes) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "  %-34s %12s\n", name, FormatBytes(bytes).c_str());
    out += buf;
  };
  out += "device (window " + std::to_string(window) + " layer slots, layer inputs on " +
         (checkpoints_on_host ? "host" : "device") + ")\n";
  row("layer slots", slot_bytes);
  row("embedding + head", edge_bytes);
  row("layer inputs", checkpoint_bytes);
  if (streamed_ring_bytes > 0) row("streamed-update ring", streamed_ring_bytes);
  if (resident_layers > 0) row(("resident layers (" + std::to_string(resident_layers) + ")").c_str(), resident_bytes);
  if (adapter_bytes > 0) row("LoRA adapters (fp32 + AdamW)", adapter_bytes);
  if (nf4_scratch_bytes > 0) row("NF4 layer load scratch", nf4_scratch_bytes);
  row("largest transient phase", peak_work_bytes);
  row("reserved (context, workspaces)", reserved_bytes);
  row("total", device_total);
  out += "host\n";
  if (adapter_bytes > 0) {  // adapter mode: the frozen base alone
    row(nf4_scratch_bytes > 0 ? "frozen base (NF4 layers)" : "frozen base weights", staging_bytes);
  } else {
    row("fp32 master weights", master_bytes);
    row(optimizer == OptimizerKind::kAdamW ? "AdamW moments (fp32)" : "AdamW moments (8-bit)", moments_bytes);
    row("compute-dtype staging", staging_bytes);
  }
  row("gradient buffers", grad_bytes);
  row("layer inputs", host_checkpoint_bytes);
  if (nvme_bytes > 0) row("NVMe tier ring buffers", nvme_ring_bytes);
  if (weight_ring_bytes > 0) row("weights-first ring", weight_ring_bytes);
  row("total", host_total);
  if (params > 0) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "  %-34s %12.2f\n", "bytes per parameter", double(host_total) / double(params));
    out += buf;
  }
  if (nvme_bytes > 0) {
    out += "NVMe (" +
           (nvme_layers < 0 ? std::string("every unit") : "the last " + std::to_string(nvme_layers) + " layers") +
           ")\n";
    row("optimizer state on disk", nvme_bytes);
  }
  return out;
}

}  // namespace slide
