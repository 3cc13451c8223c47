#include "engine/optim/adamw_8bit.h"

#include <c10/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/thread_pool.h"
#include "engine/optim/adamw_scalars.h"
#include "engine/optim/bf16_bits.h"
#include "engine/optim/code_search.h"
#include "engine/optim/simd_bf16.h"

namespace slide {
namespace {

constexpr int64_t kTileBlocks = 64;  // 16,384 elements a tile

// Block quantisation: absmax (given, or taken here when amax < 0) and each element's nearest code.
void QuantizeBlock(const float* x, int64_t len, const std::array<float, 256>& map, SimdLevel level, uint8_t* codes,
                   float* absmax, float amax = -1.0f) {
  if (amax < 0.0f) {
    amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  }
  *absmax = amax;
  if (amax == 0.0f) {
    std::fill(codes, codes + len, uint8_t{0});
    return;
  }
  QuantizeScaled(x, len, amax, map, level, codes);
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

// Elements [k, len) of the block at `begin`: dequantised, updated, the moments left in m / v for requantising.
void ScalarElements(const AdamW8bitSpan& s, const AdamWScalars& c, int64_t b, int64_t begin, int64_t k, int64_t len,
                    float* m, float* v) {
  const auto& map1 = SignedDynamicMap();
  const auto& map2 = UnsignedDynamicMap();
  for (; k < len; ++k) {
    const int64_t i = begin + k;
    m[k] = map1[s.exp_avg[i]] * s.exp_avg_absmax[b];
    v[k] = map2[s.exp_avg_sq[i]] * s.exp_avg_sq_absmax[b];
    const float p = UpdateElement(s, c, i, m[k], v[k]);
    s.param[i] = p;
    if (s.out_bf16) s.out_bf16[i].x = FloatToBf16Bits(p);
  }
}

// Blocks [first, last) of the span: dequantise, the fp32 AdamW of cpu_adamw.cc's ScalarRange, requantise.
void ScalarBlocks(const AdamW8bitSpan& s, const AdamWScalars& c, int64_t first, int64_t last) {
  float m[kQuantBlock], v[kQuantBlock];
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * kQuantBlock, len = std::min(kQuantBlock, s.n - begin);
    ScalarElements(s, c, b, begin, 0, len, m, v);
    QuantizeBlock(m, len, SignedDynamicMap(), SimdLevel::kScalar, s.exp_avg + begin, s.exp_avg_absmax + b);
    QuantizeBlock(v, len, UnsignedDynamicMap(), SimdLevel::kScalar, s.exp_avg_sq + begin, s.exp_avg_sq_absmax + b);
  }
}

// The AVX-512 body: 16 elements at a time, the same operations in the same order as the scalar path (no FMA: the
// file is built with -ffp-contract=off and the intrinsics multiply and add separately), the maps read by gathers;
// a block's last len % 16 elements take the scalar path.
struct Avx512Scalars {
  __m512 decay, w1, b2, w2, step, bc2, eps, gs;
};

__attribute__((target("avx512f,avx512bw"))) inline Avx512Scalars Broadcast(const AdamWScalars& c) {
  return {_mm512_set1_ps(c.decay),        _mm512_set1_ps(c.one_minus_b1), _mm512_set1_ps(c.b2),
          _mm512_set1_ps(c.one_minus_b2), _mm512_set1_ps(c.step_size),    _mm512_set1_ps(c.bc2_sqrt),
          _mm512_set1_ps(c.eps),          _mm512_set1_ps(c.grad_scale)};
}

// map[code] for 16 codes without a memory gather: eight 32-entry permutes of the map, picked by bits 5, 6 and 7.
__attribute__((target("avx512f,avx512bw"))) inline __m512 PermuteLookup(const std::array<float, 256>& map,
                                                                        __m512i code) {
  const float* t = map.data();
  __m512 p[8];
  for (int j = 0; j < 8; ++j)
    p[j] = _mm512_permutex2var_ps(_mm512_loadu_ps(t + 32 * j), code, _mm512_loadu_ps(t + 32 * j + 16));
  const __mmask16 b5 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(32));
  const __mmask16 b6 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(64));
  const __mmask16 b7 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(128));
  const __m512 q0 =
      _mm512_mask_blend_ps(b6, _mm512_mask_blend_ps(b5, p[0], p[1]), _mm512_mask_blend_ps(b5, p[2], p[3]));
  const __m512 q1 =
      _mm512_mask_blend_ps(b6, _mm512_mask_blend_ps(b5, p[4], p[5]), _mm512_mask_blend_ps(b5, p[6], p[7]));
  return _mm512_mask_blend_ps(b7, q0, q1);
}

// Elements [i, i + 16) of one block (absmax a1, a2): dequantised into m / v (by gathers, or by permutes where
// kPermute), updated as UpdateElement does; returns the new weights. Measured on the GPU box's 16 cores
// (bench/RESULTS.md, "8-bit AdamW: the CPU kernel"), gathers make the whole update faster and permutes the
// weights-only pass, so each pass takes its own.
template <bool kPermute>
__attribute__((target("avx512f,avx512bw"))) inline __m512 Update16(const AdamW8bitSpan& s, const Avx512Scalars& k,
                                                                   int64_t i, __m512 a1, __m512 a2, __m512* m,
                                                                   __m512* v) {
  const __m512i c1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.exp_avg + i)));
  const __m512i c2 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.exp_avg_sq + i)));
  __m512 mk, vk;
  if constexpr (kPermute) {
    mk = _mm512_mul_ps(PermuteLookup(SignedDynamicMap(), c1), a1);
    vk = _mm512_mul_ps(PermuteLookup(UnsignedDynamicMap(), c2), a2);
  } else {
    mk = _mm512_mul_ps(_mm512_i32gather_ps(c1, SignedDynamicMap().data(), 4), a1);
    vk = _mm512_mul_ps(_mm512_i32gather_ps(c2, UnsignedDynamicMap().data(), 4), a2);
  }
  __m512 g;
  if (s.grad_bf16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.grad_bf16 + i));
    g = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    g = _mm512_loadu_ps(s.grad_f32 + i);
  }
  g = _mm512_mul_ps(g, k.gs);
  __m512 p = _mm512_mul_ps(_mm512_loadu_ps(s.param + i), k.decay);
  mk = _mm512_add_ps(mk, _mm512_mul_ps(k.w1, _mm512_sub_ps(g, mk)));
  vk = _mm512_add_ps(_mm512_mul_ps(vk, k.b2), _mm512_mul_ps(k.w2, _mm512_mul_ps(g, g)));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vk), k.bc2), k.eps);
  *m = mk;
  *v = vk;
  return _mm512_sub_ps(p, _mm512_mul_ps(k.step, _mm512_div_ps(mk, denom)));
}

__attribute__((target("avx512f,avx512bw"))) inline void StoreBf16x16(c10::BFloat16* out, __m512 p) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ToBf16x16(p));
}

__attribute__((target("avx512f,avx512bw"))) void Avx512Blocks(const AdamW8bitSpan& s, const AdamWScalars& c,
                                                              int64_t first, int64_t last) {
  const Avx512Scalars k16 = Broadcast(c);
  alignas(64) float m[kQuantBlock], v[kQuantBlock];
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * kQuantBlock, len = std::min(kQuantBlock, s.n - begin);
    const __m512 a1 = _mm512_set1_ps(s.exp_avg_absmax[b]), a2 = _mm512_set1_ps(s.exp_avg_sq_absmax[b]);
    __m512 amax1 = _mm512_setzero_ps(), amax2 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= len; k += 16) {
      const int64_t i = begin + k;
      __m512 mk, vk;
      const __m512 p = Update16<false>(s, k16, i, a1, a2, &mk, &vk);
      _mm512_storeu_ps(s.param + i, p);
      if (s.out_bf16) StoreBf16x16(s.out_bf16 + i, p);
      _mm512_store_ps(m + k, mk);
      _mm512_store_ps(v + k, vk);
      amax1 = _mm512_max_ps(amax1, _mm512_abs_ps(mk));
      amax2 = _mm512_max_ps(amax2, _mm512_abs_ps(vk));
    }
    float t1 = _mm512_reduce_max_ps(amax1), t2 = _mm512_reduce_max_ps(amax2);
    const int64_t tail = k;
    ScalarElements(s, c, b, begin, tail, len, m, v);
    for (int64_t j = tail; j < len; ++j) {
      t1 = std::max(t1, std::fabs(m[j]));
      t2 = std::max(t2, std::fabs(v[j]));
    }
    QuantizeBlock(m, len, SignedDynamicMap(), SimdLevel::kAvx512, s.exp_avg + begin, s.exp_avg_absmax + b, t1);
    QuantizeBlock(v, len, UnsignedDynamicMap(), SimdLevel::kAvx512, s.exp_avg_sq + begin, s.exp_avg_sq_absmax + b, t2);
  }
}

// The weights-only pass over elements [a, b) of the span into out[0, b - a).
void ScalarWeightsOnly(const AdamW8bitSpan& s, const AdamWScalars& c, int64_t a, int64_t b, c10::BFloat16* out) {
  const auto& map1 = SignedDynamicMap();
  const auto& map2 = UnsignedDynamicMap();
  for (int64_t i = a; i < b; ++i) {
    float m = map1[s.exp_avg[i]] * s.exp_avg_absmax[i / kQuantBlock];
    float v = map2[s.exp_avg_sq[i]] * s.exp_avg_sq_absmax[i / kQuantBlock];
    out[i - a].x = FloatToBf16Bits(UpdateElement(s, c, i, m, v));
  }
}

// Vectors of 16 that start at multiples of 16 (so none straddles a block), the scalar path before and after.
__attribute__((target("avx512f,avx512bw"))) void Avx512WeightsOnly(const AdamW8bitSpan& s, const AdamWScalars& c,
                                                                   int64_t a, int64_t b, c10::BFloat16* out) {
  const Avx512Scalars k16 = Broadcast(c);
  const int64_t head = std::min(b, (a + 15) / 16 * 16);
  ScalarWeightsOnly(s, c, a, head, out);
  int64_t i = head;
  for (; i + 16 <= b; i += 16) {
    const int64_t block = i / kQuantBlock;
    __m512 m, v;
    const __m512 p = Update16<true>(s, k16, i, _mm512_set1_ps(s.exp_avg_absmax[block]),
                                    _mm512_set1_ps(s.exp_avg_sq_absmax[block]), &m, &v);
    StoreBf16x16(out + (i - a), p);
  }
  ScalarWeightsOnly(s, c, i, b, out + (i - a));
}

// The AVX2 body: the AVX-512 one's steps 8 elements at a time.
struct Avx2Scalars {
  __m256 decay, w1, b2, w2, step, bc2, eps, gs;
};

__attribute__((target("avx2,fma"))) inline Avx2Scalars Broadcast8(const AdamWScalars& c) {
  return {_mm256_set1_ps(c.decay),        _mm256_set1_ps(c.one_minus_b1), _mm256_set1_ps(c.b2),
          _mm256_set1_ps(c.one_minus_b2), _mm256_set1_ps(c.step_size),    _mm256_set1_ps(c.bc2_sqrt),
          _mm256_set1_ps(c.eps),          _mm256_set1_ps(c.grad_scale)};
}

__attribute__((target("avx2,fma"))) inline __m256 Update8(const AdamW8bitSpan& s, const Avx2Scalars& k, int64_t i,
                                                          __m256 a1, __m256 a2, __m256* m, __m256* v) {
  const __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.exp_avg + i)));
  const __m256i c2 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.exp_avg_sq + i)));
  __m256 mk = _mm256_mul_ps(_mm256_i32gather_ps(SignedDynamicMap().data(), c1, 4), a1);
  __m256 vk = _mm256_mul_ps(_mm256_i32gather_ps(UnsignedDynamicMap().data(), c2, 4), a2);
  __m256 g;
  if (s.grad_bf16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.grad_bf16 + i));
    g = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    g = _mm256_loadu_ps(s.grad_f32 + i);
  }
  g = _mm256_mul_ps(g, k.gs);
  __m256 p = _mm256_mul_ps(_mm256_loadu_ps(s.param + i), k.decay);
  mk = _mm256_add_ps(mk, _mm256_mul_ps(k.w1, _mm256_sub_ps(g, mk)));
  vk = _mm256_add_ps(_mm256_mul_ps(vk, k.b2), _mm256_mul_ps(k.w2, _mm256_mul_ps(g, g)));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vk), k.bc2), k.eps);
  *m = mk;
  *v = vk;
  return _mm256_sub_ps(p, _mm256_mul_ps(k.step, _mm256_div_ps(mk, denom)));
}

__attribute__((target("avx2,fma"))) inline float MaxOf(__m256 x) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, x);
  float m = lanes[0];
  for (int j = 1; j < 8; ++j) m = std::max(m, lanes[j]);
  return m;
}

__attribute__((target("avx2,fma"))) void Avx2Blocks(const AdamW8bitSpan& s, const AdamWScalars& c, int64_t first,
                                                    int64_t last) {
  const Avx2Scalars k8 = Broadcast8(c);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  alignas(32) float m[kQuantBlock], v[kQuantBlock];
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * kQuantBlock, len = std::min(kQuantBlock, s.n - begin);
    const __m256 a1 = _mm256_set1_ps(s.exp_avg_absmax[b]), a2 = _mm256_set1_ps(s.exp_avg_sq_absmax[b]);
    __m256 amax1 = _mm256_setzero_ps(), amax2 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
      const int64_t i = begin + k;
      __m256 mk, vk;
      const __m256 p = Update8(s, k8, i, a1, a2, &mk, &vk);
      _mm256_storeu_ps(s.param + i, p);
      if (s.out_bf16) _mm_storeu_si128(reinterpret_cast<__m128i*>(s.out_bf16 + i), ToBf16x8(p));
      _mm256_store_ps(m + k, mk);
      _mm256_store_ps(v + k, vk);
      amax1 = _mm256_max_ps(amax1, _mm256_and_ps(mk, abs_mask));
      amax2 = _mm256_max_ps(amax2, _mm256_and_ps(vk, abs_mask));
    }
    float t1 = MaxOf(amax1), t2 = MaxOf(amax2);
    const int64_t tail = k;
    ScalarElements(s, c, b, begin, tail, len, m, v);
    for (int64_t j = tail; j < len; ++j) {
      t1 = std::max(t1, std::fabs(m[j]));
      t2 = std::max(t2, std::fabs(v[j]));
    }
    QuantizeBlock(m, len, SignedDynamicMap(), SimdLevel::kAvx2, s.exp_avg + begin, s.exp_avg_absmax + b, t1);
    QuantizeBlock(v, len, UnsignedDynamicMap(), SimdLevel::kAvx2, s.exp_avg_sq + begin, s.exp_avg_sq_absmax + b, t2);
  }
}

__attribute__((target("avx2,fma"))) void Avx2WeightsOnly(const AdamW8bitSpan& s, const AdamWScalars& c, int64_t a,
                                                         int64_t b, c10::BFloat16* out) {
  const Avx2Scalars k8 = Broadcast8(c);
  const int64_t head = std::min(b, (a + 7) / 8 * 8);
  ScalarWeightsOnly(s, c, a, head, out);
  int64_t i = head;
  for (; i + 8 <= b; i += 8) {
    const int64_t block = i / kQuantBlock;
    __m256 m, v;
    const __m256 p =
        Update8(s, k8, i, _mm256_set1_ps(s.exp_avg_absmax[block]), _mm256_set1_ps(s.exp_avg_sq_absmax[block]), &m, &v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (i - a)), ToBf16x8(p));
  }
  ScalarWeightsOnly(s, c, i, b, out + (i - a));
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
    QuantizeBlock(x + begin, std::min(kQuantBlock, n - begin), map, SimdLevel::kScalar, codes + begin, absmax + b);
  }
}

void DequantizeBlockwise(const uint8_t* codes, const float* absmax, int64_t n, const std::array<float, 256>& map,
                         float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = map[codes[i]] * absmax[i / kQuantBlock];
}

void CpuAdamW8bit(const AdamW8bitSpan& span, const AdamWStepArgs& args, SimdLevel level, int threads) {
  TORCH_CHECK((span.grad_bf16 == nullptr) != (span.grad_f32 == nullptr), "CpuAdamW8bit: give exactly one gradient");
  const AdamWScalars c = MakeAdamWScalars(args);
  const int64_t blocks = (span.n + kQuantBlock - 1) / kQuantBlock;
  const int64_t tiles = (blocks + kTileBlocks - 1) / kTileBlocks;
  auto blocks_of = level == SimdLevel::kAvx512 ? Avx512Blocks : level == SimdLevel::kAvx2 ? Avx2Blocks : ScalarBlocks;
  auto run_tile = [&](int64_t t) { blocks_of(span, c, t * kTileBlocks, std::min(blocks, (t + 1) * kTileBlocks)); };
  if (threads == 1 || tiles <= 1) {
    for (int64_t t = 0; t < tiles; ++t) run_tile(t);
    return;
  }
  ThreadPool::Default().ParallelFor(tiles, run_tile);
}

void CpuAdamW8bitWeightsOnly(const AdamW8bitSpan& s, int64_t lo, int64_t hi, c10::BFloat16* out,
                             const AdamWStepArgs& args, SimdLevel level, int threads) {
  TORCH_CHECK((s.grad_bf16 == nullptr) != (s.grad_f32 == nullptr),
              "CpuAdamW8bitWeightsOnly: give exactly one gradient");
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= s.n, "CpuAdamW8bitWeightsOnly: range outside the parameter");
  const AdamWScalars c = MakeAdamWScalars(args);
  auto body = level == SimdLevel::kAvx512 ? Avx512WeightsOnly
              : level == SimdLevel::kAvx2 ? Avx2WeightsOnly
                                          : ScalarWeightsOnly;
  auto run = [&](int64_t a, int64_t b) { body(s, c, a, b, out + (a - lo)); };
  const int64_t tile = kTileBlocks * kQuantBlock, tiles = (hi - lo + tile - 1) / tile;
  if (threads == 1 || tiles <= 1) return run(lo, hi);
  ThreadPool::Default().ParallelFor(tiles, [&](int64_t t) { run(lo + t * tile, std::min(hi, lo + (t + 1) * tile)); });
}

}  // namespace slide
