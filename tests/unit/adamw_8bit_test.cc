// The blockwise 8-bit AdamW (engine/optim/adamw_8bit) against bitsandbytes' own AdamW8bit on its CPU backend, on
// fixtures it produced (scripts/make_adamw8bit_fixtures.py): the maps exactly; the quantisation's absmax exactly and
// its codes equal, or apart by no more than bitsandbytes' CPU path's 65,536-bin lookup table can put them (it rounds
// through that table instead of taking the nearest code; ours is then never farther from the value than its); five
// updates, each from bitsandbytes' state of the step before, with the master equal to a few float roundings (the
// update's arithmetic is ours, torch AdamW's order, which bitsandbytes' CPU path writes differently).
#include "engine/optim/adamw_8bit.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/optim/code_search.h"
#include "engine/optim/moment_layout.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

// bitsandbytes' fixture.
class Bnb : public testing::FixtureTensors {
 public:
  Bnb() : FixtureTensors("optim/adamw8bit.safetensors") {}
};

AdamWStepArgs FixtureArgs(int64_t step) {  // the fixture's hyperparameters (its metadata)
  AdamWStepArgs a;
  a.hp = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  a.step = step;
  return a;
}

// How far `code` of `map` scaled by absmax is from x.
float Distance(const std::array<float, 256>& map, uint8_t code, float absmax, float x) {
  return std::fabs(map[code] * absmax - x);
}

TEST(AdamW8bit, MapsAreBitsandbytesDynamicMaps) {
  Bnb bnb;
  const at::Tensor s = bnb["map.signed"], u = bnb["map.unsigned"];
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(SignedDynamicMap()[i], s[i].item<float>()) << i;
    EXPECT_EQ(UnsignedDynamicMap()[i], u[i].item<float>()) << i;
    if (i > 0) {
      EXPECT_LE(SignedDynamicMap()[i - 1], SignedDynamicMap()[i]);
    }
  }
  EXPECT_EQ(SignedDynamicMap().back(), 1.0f);
  EXPECT_EQ(UnsignedDynamicMap().front(), 0.0f);
}

TEST(AdamW8bit, QuantisationEqualsBitsandbytesOrIsNearer) {
  Bnb bnb;
  const at::Tensor x = bnb["quant.input"].contiguous(), want_codes = bnb["quant.codes"],
                   want_absmax = bnb["quant.absmax"];
  const int64_t n = x.numel(), blocks = (n + kQuantBlock - 1) / kQuantBlock;
  ASSERT_EQ(blocks, 4);  // three whole blocks (one all zeros) and a short tail
  std::vector<uint8_t> codes(n);
  std::vector<float> absmax(blocks);
  QuantizeBlockwise(x.data_ptr<float>(), n, SignedDynamicMap(), codes.data(), absmax.data());
  for (int64_t b = 0; b < blocks; ++b) EXPECT_EQ(absmax[b], want_absmax[b].item<float>()) << "block " << b;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto want = want_codes[i].item<uint8_t>();
    if (codes[i] == want) continue;
    ++differ;
    EXPECT_EQ(std::abs(int(codes[i]) - int(want)), 1) << "element " << i;
    const float a = absmax[i / kQuantBlock], v = x[i].item<float>();
    EXPECT_LE(Distance(SignedDynamicMap(), codes[i], a, v), Distance(SignedDynamicMap(), want, a, v)) << i;
  }
  EXPECT_LT(differ, n / 50) << "more than 2% of the codes differ from bitsandbytes'";
  std::vector<float> back(n);
  DequantizeBlockwise(codes.data(), absmax.data(), n, SignedDynamicMap(), back.data());
  for (int64_t i = 256; i < 512; ++i) EXPECT_EQ(back[i], 0.0f);  // the zero block
}

TEST(AdamW8bit, EachStepMatchesBitsandbytesFromItsState) {
  Bnb bnb;
  const int64_t n = bnb["param.init"].numel(), blocks = (n + kQuantBlock - 1) / kQuantBlock;
  for (int64_t step = 1; step <= 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::string before = "step" + std::to_string(step - 1) + ".";
    at::Tensor param = (step == 1 ? bnb["param.init"] : bnb[before + "param"]).clone();
    // bitsandbytes starts from code 0 with absmax 0: a zero moment.
    at::Tensor s1 = step == 1 ? at::zeros({n}, at::kByte) : bnb[before + "state1"].clone();
    at::Tensor s2 = step == 1 ? at::zeros({n}, at::kByte) : bnb[before + "state2"].clone();
    at::Tensor a1 = step == 1 ? at::zeros({blocks}) : bnb[before + "absmax1"].clone();
    at::Tensor a2 = step == 1 ? at::zeros({blocks}) : bnb[before + "absmax2"].clone();
    const at::Tensor grad = bnb["grad." + std::to_string(step)].contiguous();
    CpuAdamW8bit({.param = param.data_ptr<float>(),
                  .exp_avg = s1.data_ptr<uint8_t>(),
                  .exp_avg_absmax = a1.data_ptr<float>(),
                  .exp_avg_sq = s2.data_ptr<uint8_t>(),
                  .exp_avg_sq_absmax = a2.data_ptr<float>(),
                  .grad_f32 = grad.data_ptr<float>(),
                  .n = n},
                 FixtureArgs(step), DetectSimdLevel());
    const std::string after = "step" + std::to_string(step) + ".";
    const at::Tensor want_param = bnb[after + "param"];
    // The master: the same AdamW from the same state, its terms rounded in another order (bitsandbytes' CPU path
    // writes m * b1 + (1 - b1) * g, ours torch's lerp): a few float roundings of the weight and of the step.
    const at::Tensor tolerance = (want_param.abs() + 1e-3) * 4 * std::ldexp(1.0, -23);
    EXPECT_TRUE((param - want_param).abs().le(tolerance).all().item<bool>())
        << "largest difference " << (param - want_param).abs().max().item<float>();
    EXPECT_TRUE(at::allclose(a1, bnb[after + "absmax1"], 1e-5, 0)) << (a1 - bnb[after + "absmax1"]).abs().max();
    EXPECT_TRUE(at::allclose(a2, bnb[after + "absmax2"], 1e-5, 0)) << (a2 - bnb[after + "absmax2"]).abs().max();
    // The moments: bitsandbytes' CPU path quantises through a 65,536-bin table over [-1, 1] instead of taking the
    // nearest code, so its code may be off by up to one bin (2 / 65,535 of the block's absmax); near zero, where the
    // unsigned map's codes lie closer than a bin, that is several codes. Ours is the nearest (as its CUDA kernel's).
    // And where a moment lands within a rounding of the midpoint between two codes, the other arithmetic order
    // picks the neighbour.
    const float bin = 2.0f / 65535.0f;
    for (const auto& [name, mine, map, absmax] :
         {std::tuple{"state1", s1, &SignedDynamicMap(), a1}, {"state2", s2, &UnsignedDynamicMap(), a2}}) {
      const at::Tensor theirs = bnb[after + name];
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        const auto a = mine[i].item<uint8_t>(), b = theirs[i].item<uint8_t>();
        if (a == b) continue;
        ++differ;
        const bool adjacent = std::abs(int(a) - int(b)) == 1;  // a moment one rounding away from a code midpoint
        EXPECT_TRUE(adjacent || std::fabs((*map)[a] - (*map)[b]) <= 1.5f * bin) << name << " element " << i;
      }
      EXPECT_LT(differ, n / 20) << name;
    }
  }
}

// Tiles of whole blocks, on one thread or many, the scalar path or the SIMD body (dequantising by gathers or permutes),
// bf16 gradients and weights out: the same bits (blocks of odd lengths: the tail block and a parameter under one block
// take the scalar tail).
TEST(AdamW8bit, SimdLevelsThreadsAndTilesChangeNothing) {
  for (const int64_t n : {3 * 64 * kQuantBlock + 301, int64_t{37}}) {
    at::manual_seed(3);
    const at::Tensor p0 = at::randn({n}) * 0.02, g = (at::randn({n}) * 1e-2).to(at::kBFloat16);
    auto run = [&](SimdLevel level, int threads) {
      at::Tensor p = p0.clone(), s1 = at::zeros({n}, at::kByte), s2 = at::zeros({n}, at::kByte);
      at::Tensor a1 = at::zeros({(n + 255) / 256}), a2 = at::zeros({(n + 255) / 256});
      at::Tensor out = at::empty({n}, at::kBFloat16);
      for (int64_t step = 1; step <= 3; ++step)
        CpuAdamW8bit({.param = p.data_ptr<float>(),
                      .exp_avg = s1.data_ptr<uint8_t>(),
                      .exp_avg_absmax = a1.data_ptr<float>(),
                      .exp_avg_sq = s2.data_ptr<uint8_t>(),
                      .exp_avg_sq_absmax = a2.data_ptr<float>(),
                      .grad_bf16 = reinterpret_cast<const c10::BFloat16*>(g.data_ptr()),
                      .out_bf16 = reinterpret_cast<c10::BFloat16*>(out.data_ptr()),
                      .n = n},
                     FixtureArgs(step), level, threads);
      return std::vector<at::Tensor>{p, s1, s2, a1, a2, out};
    };
    const auto one = run(SimdLevel::kScalar, 1);
    std::vector<std::pair<SimdLevel, int>> variants{{SimdLevel::kScalar, 0}};
    for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512})
      if (static_cast<int>(level) <= static_cast<int>(DetectSimdLevel()))
        variants.insert(variants.end(), {{level, 1}, {level, 0}});
    ASSERT_EQ(variants.size(), 1 + 2 * static_cast<size_t>(DetectSimdLevel()));  // every level this CPU has
    for (const auto& [level, threads] : variants) {
      const auto other = run(level, threads);
      for (size_t k = 0; k < one.size(); ++k)
        EXPECT_TRUE(at::equal(one[k], other[k]))
            << "n " << n << " " << SimdLevelName(level) << " threads " << threads << " tensor " << k;
    }
    EXPECT_TRUE(at::equal(one[5], one[0].to(at::kBFloat16)));  // the weights out are the master rounded
  }
}

// Values that probe a code search: both ends of every bucket of 2^16 floats in [-1, 1], each code's value and its
// float neighbours, the midpoints between codes and theirs, values just outside [-1, 1], NaN, and random values.
std::vector<float> ProbeValues(const std::array<float, 256>& map) {
  std::vector<float> xs;
  for (uint32_t key = 0; key < 65536; ++key)
    for (uint32_t low : {0u, 0xFFFFu}) {
      const uint32_t bits = (key << 16) | low;
      float x;
      std::memcpy(&x, &bits, 4);
      if (std::isfinite(x) && std::fabs(x) <= 1.0f) xs.push_back(x);
    }
  for (int c = 0; c < 256; ++c) {
    const float mid = c < 255 ? (map[c] + map[c + 1]) / 2 : map[c];
    for (float x : {map[c], mid})
      for (float y : {std::nextafter(x, -2.0f), x, std::nextafter(x, 2.0f)}) xs.push_back(y);
  }
  for (float x : {-1.5f, 1.5f, -0.0f, 0.0f, std::nanf("")}) xs.push_back(x);
  at::manual_seed(5);
  const at::Tensor r = at::rand({100000}) * 2 - 1;
  for (int64_t i = 0; i < r.numel(); ++i) xs.push_back(r[i].item<float>());
  return xs;
}

// The code index gives NearestCode's code for every probe, one value at a time and by each SIMD body this CPU has
// (the probes scaled by an absmax of 1 and of 0.37, whose scaled values land between the probes; an odd length, so
// the scalar tail runs too).
TEST(AdamW8bit, IndexedNearestCodeIsNearestCode) {
  for (const auto* map : {&SignedDynamicMap(), &UnsignedDynamicMap()}) {
    std::vector<float> xs = ProbeValues(*map);
    for (float x : xs) ASSERT_EQ(IndexedNearestCode(*map, x), NearestCode(*map, x)) << x;
    xs.push_back(0.25f);  // an odd length
    for (const float amax : {1.0f, 0.37f}) {
      std::vector<uint8_t> expected(xs.size());
      for (size_t k = 0; k < xs.size(); ++k) expected[k] = NearestCode(*map, xs[k] * (1.0f / amax));
      for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (static_cast<int>(level) > static_cast<int>(DetectSimdLevel())) continue;
        std::vector<uint8_t> codes(xs.size());
        QuantizeScaled(xs.data(), static_cast<int64_t>(xs.size()), amax, *map, level, codes.data());
        for (size_t k = 0; k < xs.size(); ++k)
          ASSERT_EQ(codes[k], expected[k]) << xs[k] << " / " << amax << " " << SimdLevelName(level);
      }
    }
  }
}

// The weights-only pass (weights first) computes, from the same state, the weights the whole update writes, in any
// pieces and on any number of threads, and writes nothing else.
TEST(AdamW8bit, WeightsOnlyPassGivesTheWholeUpdatesWeightsAndKeepsTheState) {
  const int64_t n = 2 * 64 * kQuantBlock + 77;
  at::manual_seed(4);
  at::Tensor p = at::randn({n}) * 0.02, s1 = at::zeros({n}, at::kByte), s2 = at::zeros({n}, at::kByte);
  at::Tensor a1 = at::zeros({(n + 255) / 256}), a2 = at::zeros({(n + 255) / 256});
  auto span = [&](const at::Tensor& g, at::Tensor* out) {
    return AdamW8bitSpan{.param = p.data_ptr<float>(),
                         .exp_avg = s1.data_ptr<uint8_t>(),
                         .exp_avg_absmax = a1.data_ptr<float>(),
                         .exp_avg_sq = s2.data_ptr<uint8_t>(),
                         .exp_avg_sq_absmax = a2.data_ptr<float>(),
                         .grad_f32 = g.data_ptr<float>(),
                         .out_bf16 = out != nullptr ? reinterpret_cast<c10::BFloat16*>(out->data_ptr()) : nullptr,
                         .n = n};
  };
  for (int64_t step = 1; step <= 2; ++step)
    CpuAdamW8bit(span(at::randn({n}) * 1e-2, nullptr), FixtureArgs(step), SimdLevel::kScalar);
  const at::Tensor g = at::randn({n}) * 1e-2;
  const std::vector<at::Tensor> before{p.clone(), s1.clone(), s2.clone(), a1.clone(), a2.clone()};
  // Every SIMD body this CPU has, on one thread and on the pool (on AVX-512 the pass dequantises by permutes, the
  // whole update it is compared with by gathers).
  for (const auto& [level, threads] :
       {std::pair{SimdLevel::kScalar, 1}, std::pair{std::min(SimdLevel::kAvx2, DetectSimdLevel()), 0},
        std::pair{DetectSimdLevel(), 1}, std::pair{DetectSimdLevel(), 0}}) {
    at::Tensor pieces = at::empty({n}, at::kBFloat16);
    auto* out = reinterpret_cast<c10::BFloat16*>(pieces.data_ptr());
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 1000}, {1000, 1001}, {1001, 1013}, {1013, n}})
      CpuAdamW8bitWeightsOnly(span(g, nullptr), lo, hi, out + lo, FixtureArgs(3), level, threads);
    const std::vector<at::Tensor> now{p, s1, s2, a1, a2};
    for (size_t k = 0; k < now.size(); ++k) EXPECT_TRUE(at::equal(now[k], before[k])) << "state " << k;
    at::Tensor whole = at::empty({n}, at::kBFloat16);
    CpuAdamW8bit(span(g, &whole), FixtureArgs(3), DetectSimdLevel());
    EXPECT_TRUE(at::equal(pieces, whole)) << SimdLevelName(level) << " threads " << threads;
    for (size_t k = 0; k < now.size(); ++k) now[k].copy_(before[k]);  // the next round starts from the same state
  }
}

// A unit's moment buffer: fp32 for adamw; for adamw_8bit the small parameters' fp32 moments, then every block's
// absmax, then the codes, each fp32 array 4-byte aligned.
TEST(AdamW8bit, MomentLayoutPlacesEachParameter) {
  UnitLayout unit;
  int64_t offset = 0;
  for (int64_t numel : {64, 5000, 4096, 4095}) {
    unit.params.push_back(ParamSpec{.offset = offset, .numel = numel});
    offset += numel + 3;  // padding between parameters
  }
  unit.numel = offset;
  const MomentLayout fp32(OptimizerKind::kAdamW, unit);
  EXPECT_EQ(fp32.dtype(), c10::kFloat);
  EXPECT_EQ(fp32.numel(), unit.numel);
  EXPECT_EQ(fp32.params()[2].values, 4 * unit.params[2].offset);
  const MomentLayout q8(OptimizerKind::kAdamW8bit, unit);
  EXPECT_EQ(q8.dtype(), c10::kByte);
  const auto& w = q8.params();
  EXPECT_FALSE(w[0].quantized);
  EXPECT_TRUE(w[1].quantized);
  EXPECT_TRUE(w[2].quantized);  // 4,096 elements and up are quantised
  EXPECT_FALSE(w[3].quantized);
  EXPECT_EQ(w[0].values, 0);
  EXPECT_EQ(w[3].values, 4 * 64);
  const int64_t absmax = 4 * (64 + 4095);
  EXPECT_EQ(q8.float_values(), 64 + 4095 + 20 + 16);  // ceil(5000 / 256) + 4096 / 256 absmax
  EXPECT_EQ(w[1].absmax, absmax);
  EXPECT_EQ(w[2].absmax, absmax + 4 * 20);
  EXPECT_EQ(w[1].values, 4 * q8.float_values());
  EXPECT_EQ(w[2].values, 4 * q8.float_values() + 5000);
  EXPECT_EQ(q8.bytes(), 4 * q8.float_values() + 5000 + 4096);
}

}  // namespace
}  // namespace slide
