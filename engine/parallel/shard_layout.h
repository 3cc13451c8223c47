// Data parallel over several ranks (docs/multi-gpu.md): which elements of each unit a rank owns. Rank r owns one
// contiguous range of every unit: the optimizer state of those elements, their update, and its piece of the
// weights' all-gather. A boundary is the even split moved to the nearest quantisation-block start of the parameter
// it falls in (8-bit moments' blocks start at each parameter's first element, so no block is ever cut and a shard
// quantises exactly as the whole unit does), or to the next parameter's start where it rounds past the parameter's
// end or falls in padding. Every boundary is therefore 64-element aligned, as the unit's parameters are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model/param_layout.h"

namespace slide {

struct ElementRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// One rank's share of one unit: its range and the pieces of parameters in it.
struct UnitShard {
  ElementRange range;
  struct Piece {
    size_t param;   // index in the unit's params
    int64_t begin;  // elements from the parameter's first
    int64_t numel;
  };
  std::vector<Piece> pieces;
};

class ShardLayout {
 public:
  ShardLayout(const ModelLayout& layout, int world);

  int world() const { return world_; }
  const UnitShard& shard(size_t unit, int rank) const { return shards_.at(unit).at(static_cast<size_t>(rank)); }
  // The largest shard of a unit: what each rank contributes to an all-gather of equal parts.
  int64_t capacity(size_t unit) const;

 private:
  int world_;
  std::vector<std::vector<UnitShard>> shards_;  // [unit][rank]
};

// A shard as a unit of its own for the optimizer: its pieces as parameters (offsets from the range's start, shape
// [numel], each parameter's weight decay), and whether each piece's moments are 8-bit, decided by the whole
// parameter as an unsharded unit decides it (MomentLayout), so the sharded update is the whole one's bit for bit.
struct ShardUnit {
  UnitLayout layout;
  std::vector<bool> quantized;
};
ShardUnit MakeShardUnit(const UnitLayout& unit, const UnitShard& shard);

}  // namespace slide
