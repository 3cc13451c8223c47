#include "engine/optim/code_search.h"

#include <c10/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/optim/adamw_8bit.h"

namespace slide {
namespace {

constexpr uint32_t kNever = 0x10000;  // an index entry's "no transition in this bucket"

float FromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

uint32_t Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return bits;
}

// The float of bucket `key` (its top 16 bits) at `offset` in value order (the low bits count down for negative values).
float At(uint32_t key, uint32_t offset) { return FromBits((key << 16) | ((key & 0x8000) ? 0xFFFF - offset : offset)); }

// Offset of x in its bucket, in value order.
uint32_t OffsetOf(uint32_t bits) { return (bits & 0x80000000u) ? 0xFFFF - (bits & 0xFFFF) : (bits & 0xFFFF); }

// The entry of bucket `key`: the code of its lowest value | the first offset that gives the next code << 8. NearestCode
// is monotone and no bucket of 2^16 floats in either map spans more than two codes (checked here).
uint32_t BucketEntry(const std::array<float, 256>& map, uint32_t key) {
  if (!std::isfinite(At(key, 0)) || !std::isfinite(At(key, 0xFFFF))) return kNever << 8;  // NaN: code 0
  const uint8_t low = NearestCode(map, At(key, 0)), high = NearestCode(map, At(key, 0xFFFF));
  if (high == low) return low | (kNever << 8);
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
  return low | (lo << 8);
}

uint8_t FromEntry(uint32_t entry, uint32_t offset) {
  return static_cast<uint8_t>((entry & 0xFF) + (offset >= (entry >> 8) ? 1 : 0));
}

// wide: one entry per value of the top 16 bits.
struct WideIndex {
  explicit WideIndex(const std::array<float, 256>& map) {
    for (uint32_t key = 0; key < 65536; ++key) entry[key] = BucketEntry(map, key);
  }
  uint8_t Nearest(float x) const {  // x clamped to [-1, 1] or NaN
    const uint32_t bits = Bits(x);
    return FromEntry(entry[bits >> 16], OffsetOf(bits));
  }
  alignas(64) uint32_t entry[65536];
};

const WideIndex& IndexOf(const std::array<float, 256>& map) {
  static const WideIndex signed_index(SignedDynamicMap()), unsigned_index(UnsignedDynamicMap());
  if (&map == &SignedDynamicMap()) return signed_index;
  TORCH_CHECK(&map == &UnsignedDynamicMap(), "code index: not one of the dynamic maps");
  return unsigned_index;
}

// The AVX-512 bodies: 16 values at a time, clamped to [-1, 1] (NaN becomes -1: max_ps returns its second operand),
// which gives NearestCode's code 0 for NaN as the scalar path does. Each returns how many values it coded.
__attribute__((target("avx512f,avx512bw"))) inline __m512 Scaled16(const float* x, __m512 inv) {
  return _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(x), inv), _mm512_set1_ps(-1.0f)),
                       _mm512_set1_ps(1.0f));
}

__attribute__((target("avx512f,avx512bw"))) inline void Store16(uint8_t* codes, __m512i code) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtepi32_epi8(code));
}

// An entry gathered per value, the bucket offset against its transition.
__attribute__((target("avx512f,avx512bw"))) inline __m512i FromEntries16(__m512i e, __m512i bits) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF), byte = _mm512_set1_epi32(0xFF);
  const __m512i offset =
      _mm512_xor_si512(_mm512_and_si512(bits, low16), _mm512_and_si512(_mm512_srai_epi32(bits, 31), low16));
  const __mmask16 up = _mm512_cmp_epu32_mask(offset, _mm512_srli_epi32(e, 8), _MM_CMPINT_NLT);
  const __m512i code = _mm512_and_si512(e, byte);
  return _mm512_mask_add_epi32(code, up, code, _mm512_set1_epi32(1));
}

__attribute__((target("avx512f,avx512bw"))) int64_t Wide512(const float* x, int64_t len, float inv,
                                                            const WideIndex& index, uint8_t* codes) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const int* table = reinterpret_cast<const int*>(index.entry);
  int64_t k = 0;
  for (; k + 16 <= len; k += 16) {
    const __m512i bits = _mm512_castps_si512(Scaled16(x + k, vinv));
    Store16(codes + k, FromEntries16(_mm512_i32gather_epi32(_mm512_srli_epi32(bits, 16), table, 4), bits));
  }
  return k;
}

// The AVX2 body: 8 values at a time.
__attribute__((target("avx2,fma"))) inline void Store8(uint8_t* codes, __m256i code) {
  const __m256i packed = _mm256_packus_epi16(_mm256_packus_epi32(code, code), _mm256_setzero_si256());
  _mm_storel_epi64(reinterpret_cast<__m128i*>(codes), _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
                                                          packed, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0))));
}

__attribute__((target("avx2,fma"))) inline __m256i FromEntries8(__m256i e, __m256i bits) {
  const __m256i low16 = _mm256_set1_epi32(0xFFFF), byte = _mm256_set1_epi32(0xFF), ones = _mm256_set1_epi32(-1);
  const __m256i offset =
      _mm256_xor_si256(_mm256_and_si256(bits, low16), _mm256_and_si256(_mm256_srai_epi32(bits, 31), low16));
  // offset >= start of the next code (both below 2^17: a signed compare will do), as -1 / 0
  const __m256i up = _mm256_xor_si256(_mm256_cmpgt_epi32(_mm256_srli_epi32(e, 8), offset), ones);
  return _mm256_sub_epi32(_mm256_and_si256(e, byte), up);
}

__attribute__((target("avx2,fma"))) inline __m256i ScaledBits8(const float* x, __m256 inv) {
  return _mm256_castps_si256(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x), inv), _mm256_set1_ps(-1.0f)),
                                           _mm256_set1_ps(1.0f)));
}

__attribute__((target("avx2,fma"))) int64_t Wide256(const float* x, int64_t len, float inv, const WideIndex& index,
                                                    uint8_t* codes) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const int* table = reinterpret_cast<const int*>(index.entry);
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    const __m256i bits = ScaledBits8(x + k, vinv);
    Store8(codes + k, FromEntries8(_mm256_i32gather_epi32(table, _mm256_srli_epi32(bits, 16), 4), bits));
  }
  return k;
}

}  // namespace

void QuantizeScaled(const float* x, int64_t len, float amax, const std::array<float, 256>& map, SimdLevel level,
                    uint8_t* codes) {
  const WideIndex& index = IndexOf(map);
  const float inv = 1.0f / amax;
  int64_t k = 0;
  if (level == SimdLevel::kAvx512) {
    k = Wide512(x, len, inv, index, codes);
  } else if (level == SimdLevel::kAvx2) {
    k = Wide256(x, len, inv, index, codes);
  }
  for (; k < len; ++k) codes[k] = index.Nearest(std::clamp(x[k] * inv, -1.0f, 1.0f));
}

uint8_t IndexedNearestCode(const std::array<float, 256>& map, float x) {
  return IndexOf(map).Nearest(std::clamp(x, -1.0f, 1.0f));
}

}  // namespace slide
