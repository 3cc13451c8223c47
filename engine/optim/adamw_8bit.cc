#include "engine/optim/adamw_8bit.h"

#include <c10/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/thread_pool.h"
#include "engine/optim/adamw_scalars.h"
#include "engine/optim/bf16_bits.h"
#include "engine/optim/simd_bf16.h"

namespace slide {
namespace {

constexpr int64_t kTileBlocks = 64;  // 16,384 elements a tile

// NearestCode without the binary search: one table entry per value of the float's top 16 bits (sign, exponent,
// 7 mantissa bits; a "bucket" of 2^16 floats). NearestCode is monotone, and no bucket of either map spans more than
// two codes, so an entry holds the code of the bucket's lowest value and where in the bucket (its offset from the
// lowest value, in value order) the next code starts being the nearest, found with NearestCode itself: the result
// is NearestCode's bit for bit (adamw_8bit_test checks every bucket's ends and every transition).
struct CodeIndex {
  static constexpr uint32_t kNever = 0x10000;  // no transition in the bucket

  // The float of bucket `key` at `offset` in value order (the low bits count down for negative values).
  static float At(uint32_t key, uint32_t offset) {
    const uint32_t bits = (key << 16) | ((key & 0x8000) ? 0xFFFF - offset : offset);
    float x;
    std::memcpy(&x, &bits, 4);
    return x;
  }

  explicit CodeIndex(const std::array<float, 256>& map) {
    for (uint32_t key = 0; key < 65536; ++key) {
      if (!std::isfinite(At(key, 0)) || !std::isfinite(At(key, 0xFFFF))) {
        entry[key] = kNever << 8;  // infinities are clamped first; NaN gets code 0, as NearestCode gives it
        continue;
      }
      const uint8_t low = NearestCode(map, At(key, 0)), high = NearestCode(map, At(key, 0xFFFF));
      uint32_t from = kNever;
      if (high != low) {
        TORCH_CHECK(high == low + 1, "a bucket of the dynamic map spans more than two codes");
        uint32_t lo = 0, hi = 0xFFFF;  // NearestCode(At(key, hi)) == high; find the first offset that gives it
        while (lo < hi) {
          const uint32_t mid = (lo + hi) / 2;
          if (NearestCode(map, At(key, mid)) == high) {
            hi = mid;
          } else {
            lo = mid + 1;
          }
        }
        from = lo;
      }
      entry[key] = low | (from << 8);
    }
  }
  uint8_t Nearest(float x) const {
    x = std::clamp(x, -1.0f, 1.0f);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint32_t offset = (bits & 0x80000000u) ? 0xFFFF - (bits & 0xFFFF) : (bits & 0xFFFF);
    const uint32_t e = entry[bits >> 16];
    return static_cast<uint8_t>((e & 0xFF) + (offset >= (e >> 8) ? 1 : 0));
  }

  alignas(64) uint32_t entry[65536];  // code | first offset of the next code << 8
};

const CodeIndex& IndexOf(const std::array<float, 256>& map) {
  static const CodeIndex signed_index(SignedDynamicMap()), unsigned_index(UnsignedDynamicMap());
  return &map == &SignedDynamicMap() ? signed_index : unsigned_index;
}

void QuantizeBlock(const float* x, int64_t len, const CodeIndex& index, uint8_t* codes, float* absmax) {
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  *absmax = amax;
  if (amax == 0.0f) {
    std::fill(codes, codes + len, uint8_t{0});
    return;
  }
  const float inv = 1.0f / amax;
  for (int64_t i = 0; i < len; ++i) codes[i] = index.Nearest(x[i] * inv);
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
  const CodeIndex& index1 = IndexOf(SignedDynamicMap());
  const CodeIndex& index2 = IndexOf(UnsignedDynamicMap());
  float m[kQuantBlock], v[kQuantBlock];
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * kQuantBlock, len = std::min(kQuantBlock, s.n - begin);
    ScalarElements(s, c, b, begin, 0, len, m, v);
    QuantizeBlock(m, len, index1, s.exp_avg + begin, s.exp_avg_absmax + b);
    QuantizeBlock(v, len, index2, s.exp_avg_sq + begin, s.exp_avg_sq_absmax + b);
  }
}

// The AVX-512 body: 16 elements at a time, the same operations in the same order as the scalar path (no FMA: the
// file is built with -ffp-contract=off and the intrinsics multiply and add separately), the maps and the code
// index read by gathers; a block's last len % 16 elements take the scalar path.
__attribute__((target("avx512f,avx512bw"))) inline void QuantizeBlock512(const float* x, int64_t len,
                                                                         const CodeIndex& index, uint8_t* codes,
                                                                         float* absmax, float amax) {
  *absmax = amax;
  if (amax == 0.0f) {
    std::fill(codes, codes + len, uint8_t{0});
    return;
  }
  const float inv = 1.0f / amax;
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-1.0f), hi = _mm512_set1_ps(1.0f);
  const __m512i low16 = _mm512_set1_epi32(0xFFFF), byte = _mm512_set1_epi32(0xFF), one = _mm512_set1_epi32(1);
  const int* table = reinterpret_cast<const int*>(index.entry);
  int64_t k = 0;
  for (; k + 16 <= len; k += 16) {
    const __m512 q = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv), lo), hi);
    const __m512i bits = _mm512_castps_si512(q);
    const __m512i key = _mm512_srli_epi32(bits, 16);
    // offset in value order: the low 16 bits, counted down for negative values (XOR with 0xFFFF)
    const __m512i offset =
        _mm512_xor_si512(_mm512_and_si512(bits, low16), _mm512_and_si512(_mm512_srai_epi32(bits, 31), low16));
    const __m512i e = _mm512_i32gather_epi32(key, table, 4);
    const __mmask16 up = _mm512_cmp_epu32_mask(offset, _mm512_srli_epi32(e, 8), _MM_CMPINT_NLT);
    const __m512i code = _mm512_mask_add_epi32(_mm512_and_si512(e, byte), up, _mm512_and_si512(e, byte), one);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), _mm512_cvtepi32_epi8(code));
  }
  for (; k < len; ++k) codes[k] = index.Nearest(x[k] * inv);
}

struct Avx512Scalars {
  __m512 decay, w1, b2, w2, step, bc2, eps, gs;
};

__attribute__((target("avx512f,avx512bw"))) inline Avx512Scalars Broadcast(const AdamWScalars& c) {
  return {_mm512_set1_ps(c.decay),        _mm512_set1_ps(c.one_minus_b1), _mm512_set1_ps(c.b2),
          _mm512_set1_ps(c.one_minus_b2), _mm512_set1_ps(c.step_size),    _mm512_set1_ps(c.bc2_sqrt),
          _mm512_set1_ps(c.eps),          _mm512_set1_ps(c.grad_scale)};
}

// Elements [i, i + 16) of one block (absmax a1, a2): dequantised into m / v, updated as UpdateElement does; returns
// the new weights.
__attribute__((target("avx512f,avx512bw"))) inline __m512 Update16(const AdamW8bitSpan& s, const Avx512Scalars& k,
                                                                   int64_t i, __m512 a1, __m512 a2, __m512* m,
                                                                   __m512* v) {
  const __m512i c1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.exp_avg + i)));
  const __m512i c2 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.exp_avg_sq + i)));
  __m512 mk = _mm512_mul_ps(_mm512_i32gather_ps(c1, SignedDynamicMap().data(), 4), a1);
  __m512 vk = _mm512_mul_ps(_mm512_i32gather_ps(c2, UnsignedDynamicMap().data(), 4), a2);
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
  const CodeIndex& index1 = IndexOf(SignedDynamicMap());
  const CodeIndex& index2 = IndexOf(UnsignedDynamicMap());
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
      const __m512 p = Update16(s, k16, i, a1, a2, &mk, &vk);
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
    QuantizeBlock512(m, len, index1, s.exp_avg + begin, s.exp_avg_absmax + b, t1);
    QuantizeBlock512(v, len, index2, s.exp_avg_sq + begin, s.exp_avg_sq_absmax + b, t2);
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
    const __m512 p = Update16(s, k16, i, _mm512_set1_ps(s.exp_avg_absmax[block]),
                              _mm512_set1_ps(s.exp_avg_sq_absmax[block]), &m, &v);
    StoreBf16x16(out + (i - a), p);
  }
  ScalarWeightsOnly(s, c, i, b, out + (i - a));
}

// The AVX2 body: the AVX-512 one's steps 8 elements at a time.
__attribute__((target("avx2,fma"))) inline void QuantizeBlock256(const float* x, int64_t len, const CodeIndex& index,
                                                                 uint8_t* codes, float* absmax, float amax) {
  *absmax = amax;
  if (amax == 0.0f) {
    std::fill(codes, codes + len, uint8_t{0});
    return;
  }
  const float inv = 1.0f / amax;
  const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-1.0f), hi = _mm256_set1_ps(1.0f);
  const __m256i low16 = _mm256_set1_epi32(0xFFFF), byte = _mm256_set1_epi32(0xFF), ones = _mm256_set1_epi32(-1);
  const __m256i gather_bytes = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  const int* table = reinterpret_cast<const int*>(index.entry);
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    const __m256 q = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv), lo), hi);
    const __m256i bits = _mm256_castps_si256(q);
    const __m256i key = _mm256_srli_epi32(bits, 16);
    const __m256i offset =
        _mm256_xor_si256(_mm256_and_si256(bits, low16), _mm256_and_si256(_mm256_srai_epi32(bits, 31), low16));
    const __m256i e = _mm256_i32gather_epi32(table, key, 4);
    // offset >= start of the next code (both below 2^17: a signed compare will do), as -1 / 0
    const __m256i up = _mm256_xor_si256(_mm256_cmpgt_epi32(_mm256_srli_epi32(e, 8), offset), ones);
    const __m256i code = _mm256_sub_epi32(_mm256_and_si256(e, byte), up);
    const __m256i packed = _mm256_packus_epi16(_mm256_packus_epi32(code, code), _mm256_setzero_si256());
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + k),
                     _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(packed, gather_bytes)));
  }
  for (; k < len; ++k) codes[k] = index.Nearest(x[k] * inv);
}

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
  const CodeIndex& index1 = IndexOf(SignedDynamicMap());
  const CodeIndex& index2 = IndexOf(UnsignedDynamicMap());
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
    QuantizeBlock256(m, len, index1, s.exp_avg + begin, s.exp_avg_absmax + b, t1);
    QuantizeBlock256(v, len, index2, s.exp_avg_sq + begin, s.exp_avg_sq_absmax + b, t2);
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
    QuantizeBlock(x + begin, std::min(kQuantBlock, n - begin), IndexOf(map), codes + begin, absmax + b);
  }
}

void DequantizeBlockwise(const uint8_t* codes, const float* absmax, int64_t n, const std::array<float, 256>& map,
                         float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = map[codes[i]] * absmax[i / kQuantBlock];
}

uint8_t IndexedNearestCode(const std::array<float, 256>& map, float x) { return IndexOf(map).Nearest(x); }

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
