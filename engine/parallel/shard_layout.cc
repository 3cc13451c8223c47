#include "engine/parallel/shard_layout.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "engine/optim/adamw_8bit.h"
#include "engine/optim/moment_layout.h"

namespace slide {
namespace {

// Where a boundary aimed at element `target` of `unit` goes (see the header).
int64_t SnapBoundary(const UnitLayout& unit, int64_t target) {
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const ParamSpec& p = unit.params[i];
    const int64_t next = i + 1 < unit.params.size() ? unit.params[i + 1].offset : unit.numel;
    if (target >= next) continue;
    if (target <= p.offset) return p.offset;
    const int64_t block = (target - p.offset + kQuantBlock / 2) / kQuantBlock * kQuantBlock;
    return block < p.numel ? p.offset + block : next;  // a block start inside the parameter, else the next start
  }
  return unit.numel;
}

}  // namespace

ShardLayout::ShardLayout(const ModelLayout& layout, int world) : world_(world) {
  TORCH_CHECK(world >= 1, "a data-parallel job needs at least one rank, got ", world);
  for (const UnitLayout& unit : layout.units) {
    std::vector<int64_t> bounds{0};
    for (int r = 1; r < world; ++r)
      bounds.push_back(std::max(bounds.back(), SnapBoundary(unit, unit.numel * r / world)));
    bounds.push_back(unit.numel);
    std::vector<UnitShard> shards(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      UnitShard& s = shards[static_cast<size_t>(r)];
      s.range = {bounds[static_cast<size_t>(r)], bounds[static_cast<size_t>(r) + 1]};
      for (size_t i = 0; i < unit.params.size(); ++i) {
        const ParamSpec& p = unit.params[i];
        const int64_t lo = std::max(s.range.begin, p.offset), hi = std::min(s.range.end, p.offset + p.numel);
        if (lo < hi) s.pieces.push_back({i, lo - p.offset, hi - lo});
      }
    }
    shards_.push_back(std::move(shards));
  }
}

int64_t ShardLayout::capacity(size_t unit) const {
  int64_t most = 0;
  for (const UnitShard& s : shards_.at(unit)) most = std::max(most, s.range.size());
  return most;
}

ShardUnit MakeShardUnit(const UnitLayout& unit, const UnitShard& shard) {
  ShardUnit out;
  out.layout.kind = unit.kind;
  out.layout.name = unit.name;
  out.layout.numel = shard.range.size();
  for (const UnitShard::Piece& piece : shard.pieces) {
    const ParamSpec& p = unit.params[piece.param];
    ParamSpec spec;
    spec.name = p.name;
    spec.local = p.local;
    spec.shape = {piece.numel};
    spec.offset = p.offset + piece.begin - shard.range.begin;
    spec.numel = piece.numel;
    spec.weight_decay = p.weight_decay;
    out.layout.params.push_back(std::move(spec));
    out.quantized.push_back(QuantizedMoments(p.numel));
  }
  return out;
}

}  // namespace slide
