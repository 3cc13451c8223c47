// The fused CPU AdamW against the ATen reference (torch.optim.AdamW arithmetic) at odd sizes, for every SIMD
// level this CPU has, bf16 and fp32 gradients, several consecutive steps, and exact bf16 rounding.
#include "engine/optim/cpu_adamw.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "tests/support/fixtures.h"

namespace slide {
namespace {

std::vector<SimdLevel> LevelsHere() {
  std::vector<SimdLevel> levels = {SimdLevel::kScalar};
  SimdLevel best = DetectSimdLevel();
  if (best == SimdLevel::kAvx2 || best == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx2);
  if (best == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx512);
  return levels;
}

struct State {
  at::Tensor p, m, v;
};

void CheckSize(int64_t n, SimdLevel level, bool bf16_grads, int threads) {
  at::manual_seed(n);
  AdamWStepArgs args;
  args.hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  args.grad_scale = 0.7f;
  State ours{at::randn({n}), at::zeros({n}), at::zeros({n})};
  State ref{ours.p.clone(), ours.m.clone(), ours.v.clone()};
  at::Tensor out = at::empty({n}, at::kBFloat16);
  for (int64_t step = 1; step <= 3; ++step) {
    args.step = step;
    at::Tensor g = at::randn({n}) * 0.01;
    if (step == 2) g.narrow(0, 0, n / 2).zero_();  // zero gradients: pure decay + momentum
    at::Tensor g_bf16 = g.to(at::kBFloat16);
    AdamWSpan span{ours.p.data_ptr<float>(),
                   ours.m.data_ptr<float>(),
                   ours.v.data_ptr<float>(),
                   nullptr,
                   nullptr,
                   reinterpret_cast<c10::BFloat16*>(out.data_ptr()),
                   n};
    if (bf16_grads) {
      span.grad_bf16 = reinterpret_cast<const c10::BFloat16*>(g_bf16.data_ptr());
    } else {
      span.grad_f32 = g.data_ptr<float>();
    }
    CpuAdamW(span, args, level, threads);
    at::Tensor g_ref = (bf16_grads ? g_bf16.to(at::kFloat) : g) * args.grad_scale;
    AdamWHyper hp = args.hp;
    AdamWReferenceStep(ref.p, g_ref, ref.m, ref.v, hp, step);

    const std::string where = std::string(SimdLevelName(level)) + " n=" + std::to_string(n) + " step " +
                              std::to_string(step) + (bf16_grads ? " bf16" : " fp32");
    // Float rounding only: each step may round the decay, the moments and the final subtraction differently
    // (FMA contraction, operation order), about 1 ulp each of the weight and of the update (<= lr); over 3
    // steps at most ~5 ulps (6e-7 relative) of |weight| + lr.
    EXPECT_LE(testing::Compare(ours.m, ref.m).rel, 1e-6) << where;
    EXPECT_LE(testing::Compare(ours.v, ref.v).rel, 1e-6) << where;
    at::Tensor excess = (ours.p - ref.p).abs() - 6e-7 * (ref.p.abs() + args.hp.lr);
    EXPECT_LE(excess.max().item<double>(), 0.0) << where;
    // The bf16 copy is exactly the new master rounded to nearest even (c10's rounding).
    EXPECT_TRUE(at::equal(out, ours.p.to(at::kBFloat16))) << where;
  }
}

TEST(CpuAdamW, MatchesReferenceAtOddSizes) {
  for (SimdLevel level : LevelsHere()) {
    for (int64_t n : {1, 15, 22, 1025, (1 << 16) + 3, (1 << 20) + 7}) {
      CheckSize(n, level, /*bf16_grads=*/true, /*threads=*/2);
      CheckSize(n, level, /*bf16_grads=*/false, /*threads=*/1);
    }
  }
}

// The engine's invariant (streamed, resident and chunked updates bit-identical to host updates) needs every level
// to compute exactly what the scalar body computes, wherever a range starts and ends: an element in a SIMD body in
// one call may fall in the scalar tail of another. So no FMA contraction, and one operation order.
TEST(CpuAdamW, EveryLevelIsBitIdenticalToTheScalarBodyInAnyChunking) {
  for (SimdLevel level : LevelsHere()) {
    for (int64_t n : {17, 1025, (1 << 16) + 3}) {
      at::manual_seed(n);
      AdamWStepArgs args;
      args.hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
      args.grad_scale = 0.7f;
      const at::Tensor p0 = at::randn({n}), m0 = at::randn({n}) * 0.01, v0 = at::rand({n}) * 1e-4;
      const at::Tensor g = (at::randn({n}) * 0.01).to(at::kBFloat16);
      auto run = [&](SimdLevel l, int64_t chunk) {
        State s{p0.clone(), m0.clone(), v0.clone()};
        at::Tensor out = at::empty({n}, at::kBFloat16);
        for (args.step = 1; args.step <= 2; ++args.step) {
          for (int64_t begin = 0; begin < n; begin += chunk) {  // ranges starting and ending off the vector width
            const int64_t len = std::min(chunk, n - begin);
            AdamWSpan span{s.p.data_ptr<float>() + begin,
                           s.m.data_ptr<float>() + begin,
                           s.v.data_ptr<float>() + begin,
                           reinterpret_cast<const c10::BFloat16*>(g.data_ptr()) + begin,
                           nullptr,
                           reinterpret_cast<c10::BFloat16*>(out.data_ptr()) + begin,
                           len};
            CpuAdamW(span, args, l, 1);
          }
        }
        return std::make_pair(s, out);
      };
      const auto [ref, ref_out] = run(SimdLevel::kScalar, n);
      for (int64_t chunk : {n, int64_t{7}, int64_t{1000}}) {
        const auto [got, got_out] = run(level, chunk);
        const std::string where =
            std::string(SimdLevelName(level)) + " n=" + std::to_string(n) + " chunk " + std::to_string(chunk);
        EXPECT_TRUE(at::equal(got.p, ref.p)) << where;
        EXPECT_TRUE(at::equal(got.m, ref.m)) << where;
        EXPECT_TRUE(at::equal(got.v, ref.v)) << where;
        EXPECT_TRUE(at::equal(got_out, ref_out)) << where;
      }
    }
  }
}

// The SIMD bodies store the bf16 weights with aligned non-temporal stores, taking the elements before the first
// aligned output on the scalar path: an output at any offset from its inputs' alignment gets the same weights.
TEST(CpuAdamW, OutputAtAnyAlignmentGetsTheSameWeights) {
  const int64_t n = 1000;
  at::manual_seed(n);
  AdamWStepArgs args;
  args.hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const at::Tensor p0 = at::randn({n}), g = (at::randn({n}) * 0.01).to(at::kBFloat16);
  for (SimdLevel level : LevelsHere()) {
    for (bool weights_only : {true, false}) {
      at::Tensor want;
      for (int64_t offset : {0, 1, 5, 8, 15, 16}) {
        State s{p0.clone(), at::zeros({n}), at::zeros({n})};
        at::Tensor buffer = at::zeros({n + 32}, at::kBFloat16);
        AdamWSpan span;
        span.param = s.p.data_ptr<float>();
        span.exp_avg = s.m.data_ptr<float>();
        span.exp_avg_sq = s.v.data_ptr<float>();
        span.grad_bf16 = reinterpret_cast<const c10::BFloat16*>(g.data_ptr());
        span.out_bf16 = reinterpret_cast<c10::BFloat16*>(buffer.data_ptr()) + offset;
        span.n = n;
        span.weights_only = weights_only;
        CpuAdamW(span, args, level, 1);
        const at::Tensor got = buffer.narrow(0, offset, n);
        const std::string where = std::string(SimdLevelName(level)) + " offset " + std::to_string(offset) +
                                  (weights_only ? " weights only" : " whole");
        if (!want.defined()) want = got.clone();
        EXPECT_TRUE(at::equal(got, want)) << where;
        // Nothing written outside the span.
        EXPECT_EQ(buffer.narrow(0, 0, offset).count_nonzero().item<int64_t>(), 0) << where;
        EXPECT_EQ(buffer.narrow(0, offset + n, 32 - offset).count_nonzero().item<int64_t>(), 0) << where;
      }
      // And the weights are the update's: the scalar body at offset 0 computes the same.
      State s{p0.clone(), at::zeros({n}), at::zeros({n})};
      at::Tensor scalar_out = at::empty({n}, at::kBFloat16);
      AdamWSpan span{s.p.data_ptr<float>(),
                     s.m.data_ptr<float>(),
                     s.v.data_ptr<float>(),
                     reinterpret_cast<const c10::BFloat16*>(g.data_ptr()),
                     nullptr,
                     reinterpret_cast<c10::BFloat16*>(scalar_out.data_ptr()),
                     n};
      CpuAdamW(span, args, SimdLevel::kScalar, 1);
      EXPECT_TRUE(at::equal(want, scalar_out)) << SimdLevelName(level);
    }
  }
}

// The weights-only pass (the next forward's weights ahead of the whole update) writes exactly the bf16 weights the
// whole update then writes, and leaves the master and both moments untouched: every level, odd sizes, chunked
// ranges, bf16 and fp32 gradients, a clipping scale, several steps.
TEST(CpuAdamW, WeightsOnlyWritesTheWholeUpdatesWeightsAndNoState) {
  for (SimdLevel level : LevelsHere()) {
    for (int64_t n : {1, 17, 1025, (1 << 16) + 3}) {
      for (bool bf16_grads : {true, false}) {
        at::manual_seed(n);
        AdamWStepArgs args;
        args.hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
        args.grad_scale = 0.37f;
        State s{at::randn({n}), at::randn({n}) * 0.01, at::rand({n}) * 1e-4};
        at::Tensor early = at::empty({n}, at::kBFloat16), whole = at::empty({n}, at::kBFloat16);
        for (args.step = 1; args.step <= 3; ++args.step) {
          const at::Tensor g32 = at::randn({n}) * 0.01, g16 = g32.to(at::kBFloat16);
          const State before{s.p.clone(), s.m.clone(), s.v.clone()};
          auto pass = [&](at::Tensor out, bool weights_only, int64_t chunk) {
            for (int64_t begin = 0; begin < n; begin += chunk) {
              AdamWSpan span;
              span.param = s.p.data_ptr<float>() + begin;
              span.exp_avg = s.m.data_ptr<float>() + begin;
              span.exp_avg_sq = s.v.data_ptr<float>() + begin;
              if (bf16_grads) {
                span.grad_bf16 = reinterpret_cast<const c10::BFloat16*>(g16.data_ptr()) + begin;
              } else {
                span.grad_f32 = g32.data_ptr<float>() + begin;
              }
              span.out_bf16 = reinterpret_cast<c10::BFloat16*>(out.data_ptr()) + begin;
              span.n = std::min(chunk, n - begin);
              span.weights_only = weights_only;
              CpuAdamW(span, args, level, 2);
            }
          };
          pass(early, /*weights_only=*/true, 7);
          const std::string where = std::string(SimdLevelName(level)) + " n=" + std::to_string(n) + " step " +
                                    std::to_string(args.step) + (bf16_grads ? " bf16" : " fp32");
          EXPECT_TRUE(at::equal(s.p, before.p)) << where;
          EXPECT_TRUE(at::equal(s.m, before.m)) << where;
          EXPECT_TRUE(at::equal(s.v, before.v)) << where;
          pass(whole, /*weights_only=*/false, n);
          EXPECT_TRUE(at::equal(early, whole)) << where;
          EXPECT_FALSE(at::equal(s.p, before.p)) << where;  // the whole update did move the master
        }
      }
    }
  }
  AdamWSpan no_out;
  float x = 0;
  no_out.param = no_out.exp_avg = no_out.exp_avg_sq = &x;
  no_out.grad_f32 = &x;
  no_out.n = 1;
  no_out.weights_only = true;
  EXPECT_THROW(CpuAdamW(no_out, AdamWStepArgs{}, SimdLevel::kScalar, 1), c10::Error);
}

TEST(CpuAdamW, Bf16RoundingOfSpecialValues) {
  // Values chosen to hit ties, carries into the exponent, infinities and NaN through the update's output.
  const float values[] = {1.0f,
                          1.00390625f,
                          1.01171875f,
                          -3.5f,
                          65504.0f,
                          3.3895314e38f,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          1e-40f,
                          -0.0f,
                          0.1f,
                          2.7182817f,
                          1.0f,
                          -1.0f,
                          5.0f,
                          6.0f,
                          7.0f};
  const int64_t n = sizeof(values) / sizeof(values[0]);
  for (SimdLevel level : LevelsHere()) {
    at::Tensor p = at::from_blob(const_cast<float*>(values), {n}).clone();
    at::Tensor m = at::zeros({n}), v = at::zeros({n}), g = at::zeros({n});
    at::Tensor out = at::empty({n}, at::kBFloat16);
    AdamWStepArgs args;  // zero gradient, zero decay: the weight passes through unchanged
    AdamWSpan span{p.data_ptr<float>(),
                   m.data_ptr<float>(),
                   v.data_ptr<float>(),
                   nullptr,
                   g.data_ptr<float>(),
                   reinterpret_cast<c10::BFloat16*>(out.data_ptr()),
                   n};
    CpuAdamW(span, args, level, 1);
    at::Tensor expect = p.to(at::kBFloat16);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t a = reinterpret_cast<uint16_t*>(out.data_ptr())[i];
      uint16_t b = reinterpret_cast<uint16_t*>(expect.data_ptr())[i];
      if (std::isnan(values[i])) {
        EXPECT_TRUE(std::isnan(c10::BFloat16(a, c10::BFloat16::from_bits()))) << SimdLevelName(level);
      } else {
        EXPECT_EQ(a, b) << SimdLevelName(level) << " value " << values[i];
      }
    }
  }
}

}  // namespace
}  // namespace slide
