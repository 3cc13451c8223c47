#include "engine/quant/nf4_unit.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "engine/quant/nf4.h"
#include "engine/quant/tensor_nf4.h"

namespace slide {
namespace {

bool Quantized(const ParamSpec& p) { return p.shape.size() == 2; }
int64_t Blocks(int64_t numel) { return numel / kNf4Block; }
int64_t StatsBlocks(int64_t numel) { return (Blocks(numel) + kNf4StatsBlock - 1) / kNf4StatsBlock; }

// One parameter's NF4 arrays: views into the unit's.
Nf4Tensors EntryTensors(const Nf4Unit& unit, const Nf4UnitEntry& e, int64_t numel) {
  Nf4Tensors w;
  w.numel = numel;
  w.packed = unit.packed.narrow(0, e.packed_at, numel / 2);
  if (unit.double_quant) {
    w.stats_codes = unit.stats_codes.narrow(0, e.blocks_at, Blocks(numel));
    w.absmax2 = unit.absmax2.narrow(0, e.stats_at, StatsBlocks(numel));
    w.offset = e.offset;
  } else {
    w.absmax = unit.absmax.narrow(0, e.blocks_at, Blocks(numel));
  }
  return w;
}

}  // namespace

std::vector<at::Tensor*> Nf4Unit::Arrays() { return {&packed, &absmax, &stats_codes, &absmax2, &rest}; }
std::vector<const at::Tensor*> Nf4Unit::Arrays() const { return {&packed, &absmax, &stats_codes, &absmax2, &rest}; }

int64_t Nf4Unit::bytes() const {
  int64_t b = 0;
  for (const at::Tensor* t : Arrays())
    if (t->defined()) b += t->nbytes();
  return b;
}

Nf4UnitBuilder::Nf4UnitBuilder(const UnitLayout& layout, bool double_quant, c10::ScalarType rest_dtype,
                               const HostAllocator& alloc)
    : layout_(layout), set_(layout.params.size(), false) {
  unit_.numel = layout.numel;
  unit_.double_quant = double_quant;
  int64_t packed = 0, blocks = 0, stats = 0, rest = 0;
  for (const ParamSpec& p : layout.params) {
    Nf4UnitEntry e;
    e.quantized = Quantized(p);
    if (e.quantized) {
      TORCH_CHECK(p.numel % kNf4Block == 0, "Nf4UnitBuilder: ", p.name, " is not whole NF4 blocks");
      e.packed_at = packed;
      e.blocks_at = blocks;
      e.stats_at = stats;
      packed += p.numel / 2;
      blocks += Blocks(p.numel);
      stats += StatsBlocks(p.numel);
    } else {
      e.rest_at = rest;
      rest += p.numel;
    }
    unit_.entries.push_back(e);
  }
  unit_.packed = alloc(packed, at::kByte);
  if (double_quant) {
    unit_.stats_codes = alloc(blocks, at::kByte);
    unit_.absmax2 = alloc(stats, at::kFloat);
  } else {
    unit_.absmax = alloc(blocks, at::kFloat);
  }
  unit_.rest = alloc(rest, rest_dtype);
}

void Nf4UnitBuilder::SetQuantized(size_t param, const Nf4Tensors& w) {
  const ParamSpec& p = layout_.params.at(param);
  Nf4UnitEntry& e = unit_.entries[param];
  TORCH_CHECK(e.quantized && w.numel == p.numel && w.double_quant() == unit_.double_quant, "Nf4UnitBuilder: ", p.name,
              " does not take this NF4 weight");
  Nf4Tensors dst = EntryTensors(unit_, e, p.numel);
  dst.packed.copy_(w.packed.reshape({-1}));
  if (unit_.double_quant) {
    dst.stats_codes.copy_(w.stats_codes.reshape({-1}));
    dst.absmax2.copy_(w.absmax2.reshape({-1}));
    e.offset = w.offset;
  } else {
    dst.absmax.copy_(w.absmax.reshape({-1}));
  }
  set_[param] = true;
}

void Nf4UnitBuilder::SetRest(size_t param, const at::Tensor& value) {
  const ParamSpec& p = layout_.params.at(param);
  const Nf4UnitEntry& e = unit_.entries[param];
  TORCH_CHECK(!e.quantized && value.numel() == p.numel, "Nf4UnitBuilder: ", p.name, " is quantised or mis-sized");
  unit_.rest.narrow(0, e.rest_at, p.numel).copy_(value.reshape({-1}));
  set_[param] = true;
}

Nf4Unit Nf4UnitBuilder::Take() {
  for (size_t i = 0; i < set_.size(); ++i) TORCH_CHECK(set_[i], "Nf4UnitBuilder: ", layout_.params[i].name, " unset");
  return std::move(unit_);
}

Nf4Unit QuantizeNf4Unit(const UnitLayout& layout, const at::Tensor& flat, bool double_quant, c10::ScalarType rest_dtype,
                        const HostAllocator& alloc) {
  TORCH_CHECK(flat.is_cpu() && flat.numel() == layout.numel,
              "QuantizeNf4Unit: the layer's weights must be on the host");
  Nf4UnitBuilder builder(layout, double_quant, rest_dtype, alloc);
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const at::Tensor value = ParamView(layout.params[i], flat).reshape({-1});
    if (Quantized(layout.params[i]))
      builder.SetQuantized(i, QuantizeNf4Tensor(value, double_quant));
    else
      builder.SetRest(i, value);
  }
  return builder.Take();
}

Nf4Unit Nf4UnitViews(const Nf4Unit& unit, const Nf4Unit& storage) {
  Nf4Unit v;
  v.numel = unit.numel;
  v.double_quant = unit.double_quant;
  v.entries = unit.entries;
  const std::vector<const at::Tensor*> from = unit.Arrays(), into = storage.Arrays();
  const std::vector<at::Tensor*> out = v.Arrays();
  for (size_t i = 0; i < from.size(); ++i) {
    if (!from[i]->defined()) continue;
    TORCH_CHECK(
        into[i]->defined() && into[i]->numel() >= from[i]->numel() && into[i]->scalar_type() == from[i]->scalar_type(),
        "Nf4UnitViews: the storage is smaller than the unit");
    *out[i] = into[i]->narrow(0, 0, from[i]->numel());
  }
  return v;
}

void DequantizeNf4Unit(const UnitLayout& layout, const Nf4Unit& unit, const at::Tensor& dst) {
  TORCH_CHECK(dst.numel() == layout.numel && unit.entries.size() == layout.params.size(),
              "DequantizeNf4Unit: the slot or the unit does not match the layout");
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamSpec& p = layout.params[i];
    const Nf4UnitEntry& e = unit.entries[i];
    at::Tensor out = dst.narrow(0, p.offset, p.numel);
    if (e.quantized)
      DequantizeNf4Into(EntryTensors(unit, e, p.numel), out);
    else
      out.copy_(unit.rest.narrow(0, e.rest_at, p.numel), /*non_blocking=*/true);
  }
}

int64_t Nf4UnitBytes(const UnitLayout& layout, bool double_quant, int64_t rest_bytes) {
  int64_t bytes = 0;
  for (const ParamSpec& p : layout.params) {
    if (!Quantized(p)) {
      bytes += p.numel * rest_bytes;
      continue;
    }
    bytes += p.numel / 2;
    bytes += double_quant ? Blocks(p.numel) + 4 * StatsBlocks(p.numel) : 4 * Blocks(p.numel);
  }
  return bytes;
}

}  // namespace slide
