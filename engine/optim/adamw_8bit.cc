#include "engine/optim/adamw_8bit.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/thread_pool.h"
#include "engine/optim/adamw_scalars.h"
#include "engine/optim/bf16_bits.h"

namespace slide {
namespace {

constexpr int64_t kTileBlocks = 64;  // 16,384 elements a tile

void QuantizeBlock(const float* x, int64_t len, const std::array<float, 256>& map, uint8_t* codes, float* absmax) {
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  *absmax = amax;
  if (amax == 0.0f) {
    std::fill(codes, codes + len, uint8_t{0});
    return;
  }
  const float inv = 1.0f / amax;
  for (int64_t i = 0; i < len; ++i) codes[i] = NearestCode(map, x[i] * inv);
}

// One element's update from its dequantised moments (m, v in place): the fp32 AdamW of cpu_adamw.cc's
// ScalarRange, the same scalars in the same order. Returns the new weight.
inline float UpdateElement(const AdamW8bitSpan& s, const AdamWScalars& c, int64_t i, float& m, float& v) {
  const float g = (s.grad_bf16 ? Bf16ToFloat(s.grad_bf16[i]) : s.grad_f32[i]) * c.grad_scale;
  float p = s.param[i] * c.decay;
  m = m + c.one_minus_b1 * (g - m);
  v = v * c.b2 + c.one_minus_b2 * (g * g);
  const float denom = std::sqrt(v) / c.bc2_sqrt + c.eps;
  return p - c.step_size * (m / denom);
}

// Blocks [first, last) of the span: dequantise, the fp32 AdamW of cpu_adamw.cc's ScalarRange, requantise.
void UpdateBlocks(const AdamW8bitSpan& s, const AdamWScalars& c, int64_t first, int64_t last) {
  const auto& map1 = SignedDynamicMap();
  const auto& map2 = UnsignedDynamicMap();
  float m[kQuantBlock], v[kQuantBlock];
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * kQuantBlock, len = std::min(kQuantBlock, s.n - begin);
    for (int64_t k = 0; k < len; ++k) {
      m[k] = map1[s.exp_avg[begin + k]] * s.exp_avg_absmax[b];
      v[k] = map2[s.exp_avg_sq[begin + k]] * s.exp_avg_sq_absmax[b];
    }
    for (int64_t k = 0; k < len; ++k) {
      const int64_t i = begin + k;
      const float p = UpdateElement(s, c, i, m[k], v[k]);
      s.param[i] = p;
      if (s.out_bf16) s.out_bf16[i].x = FloatToBf16Bits(p);
    }
    QuantizeBlock(m, len, map1, s.exp_avg + begin, s.exp_avg_absmax + b);
    QuantizeBlock(v, len, map2, s.exp_avg_sq + begin, s.exp_avg_sq_absmax + b);
  }
}

}  // namespace

uint8_t NearestCode(const std::array<float, 256>& map, float x) {
  x = std::clamp(x, -1.0f, 1.0f);
  const float* right = std::lower_bound(map.data(), map.data() + map.size(), x);
  if (right == map.data()) return 0;
  if (right == map.data() + map.size()) return 255;
  const float* left = right - 1;
  const auto idx = static_cast<uint8_t>(right - map.data());
  return (*right - x) < (x - *left) ? idx : static_cast<uint8_t>(idx - 1);
}

void QuantizeBlockwise(const float* x, int64_t n, const std::array<float, 256>& map, uint8_t* codes, float* absmax) {
  for (int64_t b = 0; b * kQuantBlock < n; ++b) {
    const int64_t begin = b * kQuantBlock;
    QuantizeBlock(x + begin, std::min(kQuantBlock, n - begin), map, codes + begin, absmax + b);
  }
}

void DequantizeBlockwise(const uint8_t* codes, const float* absmax, int64_t n, const std::array<float, 256>& map,
                         float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = map[codes[i]] * absmax[i / kQuantBlock];
}

void CpuAdamW8bit(const AdamW8bitSpan& span, const AdamWStepArgs& args, int threads) {
  TORCH_CHECK((span.grad_bf16 == nullptr) != (span.grad_f32 == nullptr), "CpuAdamW8bit: give exactly one gradient");
  const AdamWScalars c = MakeAdamWScalars(args);
  const int64_t blocks = (span.n + kQuantBlock - 1) / kQuantBlock;
  const int64_t tiles = (blocks + kTileBlocks - 1) / kTileBlocks;
  auto run_tile = [&](int64_t t) { UpdateBlocks(span, c, t * kTileBlocks, std::min(blocks, (t + 1) * kTileBlocks)); };
  if (threads == 1 || tiles <= 1) {
    for (int64_t t = 0; t < tiles; ++t) run_tile(t);
    return;
  }
  ThreadPool::Default().ParallelFor(tiles, run_tile);
}

void CpuAdamW8bitWeightsOnly(const AdamW8bitSpan& s, int64_t lo, int64_t hi, c10::BFloat16* out,
                             const AdamWStepArgs& args, int threads) {
  TORCH_CHECK((s.grad_bf16 == nullptr) != (s.grad_f32 == nullptr),
              "CpuAdamW8bitWeightsOnly: give exactly one gradient");
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= s.n, "CpuAdamW8bitWeightsOnly: range outside the parameter");
  const AdamWScalars c = MakeAdamWScalars(args);
  const auto& map1 = SignedDynamicMap();
  const auto& map2 = UnsignedDynamicMap();
  auto run = [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      float m = map1[s.exp_avg[i]] * s.exp_avg_absmax[i / kQuantBlock];
      float v = map2[s.exp_avg_sq[i]] * s.exp_avg_sq_absmax[i / kQuantBlock];
      out[i - lo].x = FloatToBf16Bits(UpdateElement(s, c, i, m, v));
    }
  };
  const int64_t tile = kTileBlocks * kQuantBlock, tiles = (hi - lo + tile - 1) / tile;
  if (threads == 1 || tiles <= 1) return run(lo, hi);
  ThreadPool::Default().ParallelFor(tiles, [&](int64_t t) { run(lo + t * tile, std::min(hi, lo + (t + 1) * tile)); });
}

}  // namespace slide
