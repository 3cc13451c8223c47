// Data-parallel shards (engine/parallel/shard_layout.h): every unit tiled by its ranks on quantisation-block starts,
// and the optimizer run shard by shard equal to the whole unit's, bit for bit, for both optimizers.
#include "engine/parallel/shard_layout.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/model/config.h"
#include "engine/optim/adamw_8bit.h"
#include "engine/optim/moment_layout.h"
#include "engine/optim/unit_adamw.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

ModelConfig Config(const std::string& json) { return testing::ValueOrDie(ParseHfConfig(json, "test")); }

const char* kLlama8b = R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8})";
// Biases of 72 and 36 elements (not multiples of 64: padding follows them) and matrices of a few blocks.
const char* kQwen2Small = R"({"model_type": "qwen2", "vocab_size": 300, "hidden_size": 72,
    "intermediate_size": 200, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})";
// Every parameter of a layer over 4,096 elements but the norms: several blocks each, a partial last block.
const char* kLlamaSmall = R"({"model_type": "llama", "vocab_size": 500, "hidden_size": 128,
    "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})";

TEST(ShardLayout, TilesEveryUnitOnQuantisationBlockStarts) {
  for (const char* json : {kLlama8b, kQwen2Small, kLlamaSmall}) {
    const ModelLayout layout = BuildModelLayout(Config(json));
    for (int world : {1, 2, 3, 4, 8}) {
      const ShardLayout shards(layout, world);
      for (size_t u = 0; u < layout.units.size(); ++u) {
        const UnitLayout& unit = layout.units[u];
        SCOPED_TRACE(unit.name + " world " + std::to_string(world));
        std::vector<int64_t> covered(unit.params.size(), 0);
        int64_t expected_begin = 0;
        for (int r = 0; r < world; ++r) {
          const UnitShard& s = shards.shard(u, r);
          EXPECT_EQ(s.range.begin, expected_begin) << "rank " << r;
          EXPECT_LE(s.range.begin, s.range.end);
          EXPECT_EQ(s.range.begin % kParamAlignElems, 0) << "rank " << r;
          expected_begin = s.range.end;
          for (const ParamSpec& p : unit.params) {  // a boundary inside a parameter starts one of its blocks
            if (s.range.begin > p.offset && s.range.begin < p.offset + p.numel) {
              EXPECT_EQ((s.range.begin - p.offset) % kQuantBlock, 0) << p.local << " rank " << r;
            }
          }
          for (const UnitShard::Piece& piece : s.pieces) {
            EXPECT_EQ(piece.begin, covered[piece.param]) << unit.params[piece.param].local;  // in order, no gap
            covered[piece.param] += piece.numel;
          }
        }
        EXPECT_EQ(expected_begin, unit.numel);
        for (size_t i = 0; i < unit.params.size(); ++i) EXPECT_EQ(covered[i], unit.params[i].numel) << i;
        // As even as the snapping allows: each boundary moves by at most a block and a parameter's padding.
        if (unit.kind == UnitKind::kDecoderLayer && json == kLlama8b) {
          EXPECT_LE(shards.capacity(u), unit.numel / world + 2 * (kQuantBlock + kParamAlignElems));
        }
      }
    }
  }
}

TEST(ShardLayout, RefusesNoRanks) {
  const ModelLayout layout = BuildModelLayout(Config(kQwen2Small));
  EXPECT_THROW(ShardLayout(layout, 0), c10::Error);
}

// One unit's state, for either optimizer: the master, both moments as MomentLayout lays them out, the bf16 weights.
struct UnitState {
  at::Tensor master, exp_avg, exp_avg_sq, weights;
};

UnitState ZeroState(const UnitLayout& unit, const MomentLayout& moments, const at::Tensor& master) {
  const auto dtype = moments.dtype();
  return {master.clone(), at::zeros({moments.numel()}, dtype), at::zeros({moments.numel()}, dtype),
          at::zeros({unit.numel}, at::kBFloat16)};
}

at::Tensor MomentBytes(const at::Tensor& buffer) { return buffer.view(at::kByte); }

// The shard's piece of parameter `piece.param` in the whole unit's moment bytes, and in the shard's own.
void ExpectSameMoments(const MomentLayout& whole, const at::Tensor& whole_buf, const MomentLayout& part,
                       const at::Tensor& part_buf, const UnitShard::Piece& piece, size_t index) {
  const MomentLayout::Param& w = whole.params()[piece.param];
  const MomentLayout::Param& s = part.params()[index];
  ASSERT_EQ(w.quantized, s.quantized);
  const at::Tensor a = MomentBytes(whole_buf), b = MomentBytes(part_buf);
  const bool fp32 = whole.kind() == OptimizerKind::kAdamW || !w.quantized;
  if (fp32) {
    EXPECT_TRUE(
        at::equal(a.narrow(0, w.values + 4 * piece.begin, 4 * piece.numel), b.narrow(0, s.values, 4 * piece.numel)));
    return;
  }
  ASSERT_EQ(piece.begin % kQuantBlock, 0);
  const int64_t blocks = MomentLayout::Blocks(piece.numel);
  EXPECT_TRUE(at::equal(a.narrow(0, w.values + piece.begin, piece.numel), b.narrow(0, s.values, piece.numel)));
  EXPECT_TRUE(at::equal(a.narrow(0, w.absmax + 4 * (piece.begin / kQuantBlock), 4 * blocks),
                        b.narrow(0, s.absmax, 4 * blocks)));
}

// Each rank updating only its shard (its own state buffers, laid out for the shard) gives the whole unit's update,
// master, bf16 weights and moments, bit for bit, over three steps, for every world size and both optimizers.
TEST(ShardLayout, ShardedUpdatesEqualTheWholeUnits) {
  const ModelLayout layout = BuildModelLayout(Config(kLlamaSmall));
  const SimdLevel simd = DetectSimdLevel();
  at::manual_seed(11);
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdamW8bit}) {
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const UnitLayout& unit = layout.units[u];
      const MomentLayout whole_moments(kind, unit);
      const at::Tensor master = at::randn({unit.numel}) * 0.02;
      std::vector<at::Tensor> grads;
      for (int s = 0; s < 3; ++s) grads.push_back((at::randn({unit.numel}) * 1e-2).to(at::kBFloat16));
      UnitState whole = ZeroState(unit, whole_moments, master);
      auto args = [](int64_t step) {
        AdamWStepArgs a;
        a.hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
        a.step = step;
        a.grad_scale = 0.8f;
        return a;
      };
      for (int s = 0; s < 3; ++s)
        DeviceUnitAdamW(unit, whole_moments, whole.master, whole.exp_avg, whole.exp_avg_sq, grads[s], whole.weights,
                        args(s + 1), simd);
      for (int world : {2, 3, 4}) {
        const ShardLayout shards(layout, world);
        for (int r = 0; r < world; ++r) {
          SCOPED_TRACE(std::string(OptimizerName(kind)) + " " + unit.name + " world " + std::to_string(world) +
                       " rank " + std::to_string(r));
          const UnitShard& shard = shards.shard(u, r);
          const ShardUnit part = MakeShardUnit(unit, shard);
          const MomentLayout part_moments(kind, part.layout, part.quantized);
          const ElementRange& range = shard.range;
          UnitState mine = ZeroState(part.layout, part_moments, master.narrow(0, range.begin, range.size()));
          for (int s = 0; s < 3; ++s)
            DeviceUnitAdamW(part.layout, part_moments, mine.master, mine.exp_avg, mine.exp_avg_sq,
                            grads[s].narrow(0, range.begin, range.size()), mine.weights, args(s + 1), simd);
          for (size_t i = 0; i < shard.pieces.size(); ++i) {
            const UnitShard::Piece& piece = shard.pieces[i];
            const int64_t at_whole = unit.params[piece.param].offset + piece.begin;
            const int64_t at_part = part.layout.params[i].offset;
            EXPECT_TRUE(
                at::equal(whole.master.narrow(0, at_whole, piece.numel), mine.master.narrow(0, at_part, piece.numel)));
            EXPECT_TRUE(at::equal(whole.weights.narrow(0, at_whole, piece.numel),
                                  mine.weights.narrow(0, at_part, piece.numel)));
            ExpectSameMoments(whole_moments, whole.exp_avg, part_moments, mine.exp_avg, piece, i);
            ExpectSameMoments(whole_moments, whole.exp_avg_sq, part_moments, mine.exp_avg_sq, piece, i);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace slide
