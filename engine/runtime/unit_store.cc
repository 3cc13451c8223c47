#include "engine/runtime/unit_store.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/memory/host_array.h"
#include "engine/runtime/device_queue.h"

namespace slide {
namespace {

// Placements by the options: resident layers first, the tier's units, then every k-th remaining host layer streamed
// by the share (the share of the first m host layers is floor(m * share): a layer streams when that count steps up).
std::vector<Placement> Placements(const ModelLayout& layout, const SlidingOptions& o,
                                  const std::vector<int64_t>& tier_index) {
  std::vector<Placement> p(layout.units.size(), Placement::kHost);
  for (size_t u = 0; u < p.size(); ++u) {
    if (u >= 1 && u <= static_cast<size_t>(o.resident_layers)) p[u] = Placement::kResident;
    if (!tier_index.empty() && tier_index[u] >= 0) p[u] = Placement::kTier;
  }
  if (o.device_update_share > 0) {
    int64_t host_layers = 0;
    for (int64_t i = 0; i < layout.num_layers(); ++i) {
      if (p[1 + i] == Placement::kResident) continue;
      if (std::floor((host_layers + 1) * o.device_update_share) > std::floor(host_layers * o.device_update_share))
        p[1 + i] = Placement::kStreamed;
      ++host_layers;
    }
  }
  return p;
}

// A tiered unit's moment buffer in the tier's 4-byte words (fp32 moments: its numel).
int64_t TierWords(const UnitLayout& unit, OptimizerKind optimizer) {
  return (MomentLayout(optimizer, unit).bytes() + 3) / 4;
}

}  // namespace

StateTierOptions TierOptionsFor(const ModelLayout& layout, const SlidingOptions& options) {
  StateTierOptions tier = options.nvme;
  if (tier.mode == TierMode::kNone || options.train.optimizer == OptimizerKind::kAdamW) return tier;
  // Whole units a buffer: three hold the next unit's read, this one's update and the last one's write-back.
  tier.buffers = std::min(tier.buffers, 3);
  const size_t block = std::max<size_t>(1, tier.io.block_bytes);
  auto index = TierUnitIndex(layout.num_layers(), tier);  // a bad count fails where the tier opens; size for all
  for (size_t u = 0; u < layout.units.size(); ++u) {
    if (index.ok() && (*index)[u] < 0) continue;  // stays in host memory: its size does not matter
    const size_t bytes = 4 * static_cast<size_t>(TierWords(layout.units[u], options.train.optimizer));
    tier.chunk_bytes = std::max(tier.chunk_bytes, (bytes + block - 1) / block * block);
  }
  return tier;
}

// Adapter mode: each unit's weights, converted to the compute dtype one unit at a time (page-locked where a device
// copies from them), the loaded copy released as it goes; on the CPU an fp32 model computing in fp32 is adopted.
void UnitStore::StoreFrozen(ModelParams&& loaded_params, std::vector<Nf4Unit> nf4_layers) {
  const auto dtype = options_.train.compute_dtype;
  const bool on_cuda = options_.train.device.is_cuda();
  auto pinned = [&](int64_t numel, c10::ScalarType t) { return queue_.AllocateHost(numel, t); };
  TORCH_CHECK(nf4_layers.empty() || (options_.nf4_base && nf4_layers.size() == size_t(layout_.num_layers())),
              "NF4 layers given without an NF4 base, or not one per layer");
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    at::Tensor& loaded = loaded_params.units[u];
    unit.placement = Placement::kFrozen;
    moments_.emplace_back(OptimizerKind::kAdamW, layout_.units[u]);
    const bool layer = layout_.units[u].kind == UnitKind::kDecoderLayer;
    if (options_.nf4_base && layer) {
      Nf4Unit nf4;
      if (nf4_layers.empty()) {
        nf4 = QuantizeNf4Unit(layout_.units[u], loaded, options_.nf4_base->double_quant, dtype, pinned);
      } else {  // page-locked copies of the given arrays, one layer at a time
        Nf4Unit& given = nf4_layers[u - 1];
        TORCH_CHECK(given.numel == layout_.units[u].numel && given.entries.size() == layout_.units[u].params.size(),
                    "NF4 layer ", u - 1, " does not match its layout");
        nf4 = given;
        for (at::Tensor* a : nf4.Arrays())
          if (a->defined()) *a = pinned(a->numel(), a->scalar_type()).copy_(*a);
        given = Nf4Unit();
      }
      unit.nf4 = std::make_shared<const Nf4Unit>(std::move(nf4));
      loaded = at::Tensor();
      continue;
    }
    TORCH_CHECK(loaded.numel() == layout_.units[u].numel, "unit ", u, "'s weights do not match its layout");
    if (!on_cuda && loaded.scalar_type() == dtype && loaded.is_cpu() && loaded.is_contiguous()) {
      unit.staging = loaded;
    } else {
      unit.staging = queue_.AllocateHost(layout_.units[u].numel, dtype);
      unit.staging.copy_(loaded);
    }
    loaded = at::Tensor();
  }
}

StatusOr<std::unique_ptr<StateTier>> UnitStore::OpenTier(const ModelLayout& layout, const SlidingOptions& options) {
  if (options.nvme.mode == TierMode::kNone) return std::unique_ptr<StateTier>();
  SLIDE_ASSIGN_OR_RETURN(const std::vector<int64_t> index, TierUnitIndex(layout.num_layers(), options.nvme));
  std::vector<int64_t> words;
  for (size_t u = 0; u < layout.units.size(); ++u)
    if (index[u] >= 0) words.push_back(TierWords(layout.units[u], options.train.optimizer));
  return StateTier::Open(TierOptionsFor(layout, options), words);
}

UnitStore::UnitStore(ModelParams&& master_fp32, const SlidingOptions& options, DeviceQueue& queue,
                     std::unique_ptr<StateTier> tier, std::vector<Nf4Unit> nf4_layers)
    : layout_(master_fp32.layout), options_(options), queue_(queue), tier_(std::move(tier)) {
  const auto dtype = options.train.compute_dtype;
  const bool on_cuda = options.train.device.is_cuda();
  std::vector<int64_t> tier_index;
  if (options.nvme.mode != TierMode::kNone) {
    auto index = TierUnitIndex(layout_.num_layers(), options.nvme);
    TORCH_CHECK(index.ok(), index.status().ToString());  // ValidateSlidingOptions checked the options
    tier_index = std::move(index).value();
    if (!tier_) {
      auto opened = OpenTier(layout_, options);
      TORCH_CHECK(opened.ok(), opened.status().ToString());
      tier_ = std::move(opened).value();
    }
  }
  TORCH_CHECK(!tier_ || static_cast<int64_t>(tier_->units()) ==
                            std::count_if(tier_index.begin(), tier_index.end(), [](int64_t i) { return i >= 0; }),
              "the NVMe tier given was opened for other units than options.nvme names");
  units_.resize(layout_.units.size());
  if (options.adapter) {
    StoreFrozen(std::move(master_fp32), std::move(nf4_layers));
    return;
  }
  const std::vector<Placement> placement = Placements(layout_, options, tier_index);
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].placement = placement[u];
    units_[u].tier_index = tier_index.empty() ? -1 : tier_index[u];
    moments_.emplace_back(options.train.optimizer, layout_.units[u]);
  }
  auto master_on_disk = [&](size_t u) { return units_[u].on_tier() && tier_->holds_master(); };
  auto moment_zeros = [&](size_t u) {
    const int64_t numel = moments_[u].numel();
    const c10::ScalarType dtype = moments_[u].dtype();
    return units_[u].stream_capable() ? queue_.AllocateHost(numel, dtype).zero_()
                                      : HostArray(numel, dtype, options.host_huge_pages);
  };
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    at::Tensor& loaded = master_fp32.units[u];
    const int64_t numel = layout_.units[u].numel;
    if (unit.resident()) {  // the state moves to the device; the host keeps nothing of this unit
      const auto dev_f32 = at::TensorOptions().dtype(at::kFloat).device(options.train.device);
      unit.dev_master = loaded.to(dev_f32);
      const auto dev_moments = at::TensorOptions().dtype(moments_[u].dtype()).device(options.train.device);
      unit.dev_exp_avg = at::zeros({moments_[u].numel()}, dev_moments);  // fp32 [numel], or adamw_8bit's bytes
      unit.dev_exp_avg_sq = at::zeros({moments_[u].numel()}, dev_moments);
      unit.dev_weights = dtype == c10::kFloat ? unit.dev_master : unit.dev_master.to(dtype);  // RNE, as AdamW writes
      loaded = at::Tensor();
      continue;
    }
    // The loaded master moves, one unit at a time, into a page-locked buffer (streamed) or its own mapping (huge
    // pages unless turned off).
    if (unit.stream_capable()) {
      unit.master = queue_.AllocateHost(numel, at::kFloat).copy_(loaded);
    } else if (!master_on_disk(u)) {
      TORCH_CHECK(loaded.is_contiguous() && loaded.numel() == numel, "unit ", u,
                  "'s master weights do not match its layout");
      unit.master = HostArray(numel, at::kFloat, options.host_huge_pages, loaded.const_data_ptr<float>());
    } else {
      unit.master = loaded;  // until written to the tier below
    }
    loaded = at::Tensor();
    if (dtype == c10::kFloat && !on_cuda && !master_on_disk(u)) {
      unit.staging = unit.master;  // fp32 on the host: the master is what the forward loads
    } else {
      unit.staging = queue_.AllocateHost(numel, dtype);
      unit.staging.copy_(unit.master);
    }
    if (master_on_disk(u)) {  // unit by unit, so the host never holds the fp32 model and all its staging at once
      Status st = tier_->WriteArray(unit.tier_index, kMasterArray, unit.master.data_ptr<float>());
      TORCH_CHECK(st.ok(), "writing the master weights to the NVMe tier: ", st.ToString());
      unit.master = at::Tensor();
    }
  }
  // The moments last: by now the masters that moved to the device or the tier are gone, so the host's peak during
  // start-up is the plan's total rather than that plus those masters.
  int64_t cpu_numel = 0, streamed_numel = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].host_held()) continue;
    units_[u].exp_avg = moment_zeros(u);
    units_[u].exp_avg_sq = moment_zeros(u);
    (units_[u].stream_capable() ? streamed_numel : cpu_numel) += layout_.units[u].numel;
  }
  if (cpu_numel > 0) streamed_per_cpu_element_ = double(streamed_numel) / double(cpu_numel);
}

int64_t UnitStore::largest_layer_numel() const {
  int64_t n = 0;
  for (int64_t i = 0; i < layout_.num_layers(); ++i) n = std::max(n, layout_.layer(i).numel);
  return n;
}

int64_t UnitStore::streamed_units() const {
  return std::count_if(units_.begin(), units_.end(), [](const Unit& u) { return u.stream_capable(); });
}

at::Tensor UnitStore::LandingBuffer(size_t unit, bool accumulating) {
  const Unit& x = units_[unit];
  if (!accumulating && !x.staging.is_same(x.master)) return x.staging;
  if (!x.grad_landing.defined()) {
    for (size_t u = 0; u < units_.size(); ++u)
      if (!units_[u].resident())
        units_[u].grad_landing = queue_.AllocateHost(layout_.units[u].numel, options_.train.compute_dtype);
  }
  return x.grad_landing;
}

void UnitStore::EnsureGradSums() {
  if (has_grad_sums_) return;
  std::vector<at::Tensor> sums;
  for (size_t u = 0; u < units_.size(); ++u) {
    const int64_t numel = layout_.units[u].numel;
    sums.push_back(units_[u].resident()         ? at::Tensor()
                   : units_[u].stream_capable() ? queue_.AllocateHost(numel, at::kFloat)  // copied up
                                                : HostArray(numel, at::kFloat, options_.host_huge_pages));
  }
  for (size_t u = 0; u < units_.size(); ++u) units_[u].grad_sum = std::move(sums[u]);
  has_grad_sums_ = true;
}

at::Tensor UnitStore::UpdateGradient(size_t unit, bool accumulating) {
  return accumulating ? units_[unit].grad_sum : LandingBuffer(unit, false);
}

// Checkpoint kind -> the tier's array, and the host buffer that holds it when the tier does not (null when it does).
at::Tensor* UnitStore::HostState(StateKind kind, size_t unit, StateArray* array) {
  *array = kind == StateKind::kMaster ? kMasterArray : kind == StateKind::kExpAvg ? kExpAvg : kExpAvgSq;
  Unit& x = units_[unit];
  const bool on_disk = x.on_tier() && (*array != kMasterArray || tier_->holds_master());
  if (on_disk) return nullptr;
  return kind == StateKind::kMaster ? &x.master : kind == StateKind::kExpAvg ? &x.exp_avg : &x.exp_avg_sq;
}

StateShape UnitStore::StateShapeOf(StateKind kind, size_t unit) const {
  if (kind == StateKind::kMaster) return {c10::kFloat, layout_.units[unit].numel};
  const MomentLayout& m = moments_[unit];
  return {m.dtype(), m.numel(), m.dtype() == c10::kByte ? m.float_values() : 0};
}

StatusOr<at::Tensor> UnitStore::ReadState(StateKind kind, size_t unit) {
  if (unit >= units_.size()) return InvalidArgument("no such optimizer state");
  const Unit& x = units_[unit];
  if (x.resident())
    return (kind == StateKind::kMaster   ? x.dev_master
            : kind == StateKind::kExpAvg ? x.dev_exp_avg
                                         : x.dev_exp_avg_sq)
        .cpu();
  StateArray array;
  if (at::Tensor* host = HostState(kind, unit, &array)) return *host;
  // The tier's array in words; the state is its first bytes (8-bit moments) or all of it.
  const StateShape shape = StateShapeOf(kind, unit);
  const int64_t bytes = shape.numel * static_cast<int64_t>(c10::elementSize(shape.dtype));
  at::Tensor words = at::empty({(bytes + 3) / 4}, at::kFloat);
  SLIDE_RETURN_IF_ERROR(tier_->ReadArray(x.tier_index, array, words.data_ptr<float>()));
  return shape.dtype == c10::kFloat ? words : words.view(at::kByte).narrow(0, 0, bytes);
}

Status UnitStore::WriteState(StateKind kind, size_t unit, const at::Tensor& src) {
  if (unit >= units_.size()) return InvalidArgument("no such optimizer state");
  Unit& x = units_[unit];
  if (x.resident()) {
    (kind == StateKind::kMaster   ? x.dev_master
     : kind == StateKind::kExpAvg ? x.dev_exp_avg
                                  : x.dev_exp_avg_sq)
        .copy_(src);
    return Status::Ok();
  }
  StateArray array;
  if (at::Tensor* host = HostState(kind, unit, &array)) {
    host->copy_(src);
    return Status::Ok();
  }
  at::Tensor f32;
  if (src.scalar_type() == at::kByte) {  // 8-bit moments: their bytes in the tier's words, the rest zero
    f32 = at::zeros({(src.numel() + 3) / 4}, at::kFloat);
    f32.view(at::kByte).narrow(0, 0, src.numel()).copy_(src);
  } else {
    f32 = src.to(at::kFloat).contiguous();
  }
  SLIDE_RETURN_IF_ERROR(tier_->WriteArray(x.tier_index, array, f32.data_ptr<float>()));
  if (array == kMasterArray) x.staging.copy_(f32);  // RefreshWeights cannot read a master it does not hold
  return Status::Ok();
}

void UnitStore::RefreshWeights() {
  for (Unit& x : units_) {
    if (x.resident() && !x.dev_weights.is_same(x.dev_master)) x.dev_weights.copy_(x.dev_master);
    if (x.master.defined() && !x.staging.is_same(x.master)) x.staging.copy_(x.master);  // RNE, as AdamW writes it
  }
}

}  // namespace slide
