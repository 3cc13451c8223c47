#include "engine/optim/code_search.h"

#include <c10/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <climits>
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

// compact: the wide index's buckets for magnitudes from 2^-24 to 1 (top-16 magnitude keys kLowKey..kHighKey); every
// smaller magnitude gives the map's zero code (checked here), so they share slot 0. The signed map keeps a half for
// each sign; in the unsigned map every negative value gives code 0 too, so they take slot 0 as well.
struct CompactIndex {
  static constexpr uint32_t kLowKey = 0x3380;                // 2^-24
  static constexpr uint32_t kHighKey = 0x3F80;               // 1.0, the largest after clamping
  static constexpr uint32_t kHalf = kHighKey - kLowKey + 2;  // slot 0 (tiny), then kLowKey..kHighKey

  CompactIndex(const std::array<float, 256>& map, bool has_sign) : has_sign(has_sign) {
    const uint8_t zero = NearestCode(map, 0.0f);
    const float largest_tiny = FromBits((kLowKey << 16) - 1);
    TORCH_CHECK(NearestCode(map, largest_tiny) == zero && NearestCode(map, -largest_tiny) == zero,
                "compact code index: magnitudes under 2^-24 do not all give the zero code");
    TORCH_CHECK(has_sign || NearestCode(map, -1.0f) == zero, "compact code index: negative values of an unsigned map");
    for (uint32_t half = 0; half < (has_sign ? 2u : 1u); ++half) {
      entry[half * kHalf] = zero | (kNever << 8);
      for (uint32_t key = kLowKey; key <= kHighKey; ++key)
        entry[half * kHalf + key - kLowKey + 1] = BucketEntry(map, key | (half << 15));
    }
  }
  uint8_t Nearest(float x) const {  // x clamped to [-1, 1] or NaN
    if (std::isnan(x)) return 0;
    const uint32_t bits = Bits(x), magnitude = (bits >> 16) & 0x7FFF;
    const uint32_t bucket = magnitude < kLowKey ? 0 : magnitude - kLowKey + 1;
    const bool negative = bits >> 31;
    const uint32_t slot = has_sign ? bucket + (negative ? kHalf : 0) : (negative ? 0 : bucket);
    return FromEntry(entry[slot], OffsetOf(bits));
  }
  bool has_sign;
  alignas(64) uint32_t entry[2 * kHalf];
};

// Order-preserving integer of a float (+0 and -0 alike): float order is integer order.
int32_t Ordered(float x) {
  int32_t i;
  std::memcpy(&i, &x, 4);
  return i >= 0 ? i : INT32_MIN - i;
}

float FromOrdered(int32_t o) {
  const int32_t i = o >= 0 ? o : INT32_MIN - o;
  float x;
  std::memcpy(&x, &i, 4);
  return x;
}

// tree: boundary[j] is the least float in [-1, 1] NearestCode maps above code j, so that for x in [-1, 1] its code
// is the number of boundaries <= x. The binary search over them as a tree: level L (0..7) holds the 2^L boundaries
// boundary[((2n + 1) << (7 - L)) - 1] its nodes n compare with; after level L, n is the code's top L + 1 bits.
struct ThresholdTree {
  explicit ThresholdTree(const std::array<float, 256>& map) {
    std::array<float, 255> boundary;
    int32_t lo = Ordered(-1.0f);
    const int32_t top = Ordered(1.0f);
    for (int j = 0; j < 255; ++j) {
      int32_t hi = top;  // NearestCode(1) = 255 > j
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (NearestCode(map, FromOrdered(mid)) > j) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      boundary[j] = FromOrdered(lo);
    }
    for (int level = 0; level < 8; ++level)
      for (int n = 0; n < (1 << level); ++n) nodes[level][n] = boundary[((2 * n + 1) << (7 - level)) - 1];
  }
  uint8_t Nearest(float x) const {  // x clamped to [-1, 1] or NaN (code 0: every comparison with NaN fails)
    int n = 0;
    for (int level = 0; level < 8; ++level) n = 2 * n + (x >= nodes[level][n] ? 1 : 0);
    return static_cast<uint8_t>(n);
  }
  alignas(64) float nodes[8][128] = {};
};

struct Searches {
  Searches(const std::array<float, 256>& map, bool has_sign) : wide(map), compact(map, has_sign), tree(map) {}
  uint8_t Nearest(float x, CodeSearch search) const {
    x = std::clamp(x, -1.0f, 1.0f);
    switch (search) {
      case CodeSearch::kWide:
        return wide.Nearest(x);
      case CodeSearch::kCompact:
        return compact.Nearest(x);
      case CodeSearch::kTree:
        return tree.Nearest(x);
    }
    return 0;
  }
  WideIndex wide;
  CompactIndex compact;
  ThresholdTree tree;
};

const Searches& SearchesOf(const std::array<float, 256>& map) {
  static const Searches signed_searches(SignedDynamicMap(), true), unsigned_searches(UnsignedDynamicMap(), false);
  if (&map == &SignedDynamicMap()) return signed_searches;
  TORCH_CHECK(&map == &UnsignedDynamicMap(), "code search: not one of the dynamic maps");
  return unsigned_searches;
}

std::atomic<CodeSearch> g_search{CodeSearch::kWide};

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

__attribute__((target("avx512f,avx512bw"))) int64_t Compact512(const float* x, int64_t len, float inv,
                                                               const CompactIndex& index, uint8_t* codes) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i below = _mm512_set1_epi32(CompactIndex::kLowKey - 1), magnitude = _mm512_set1_epi32(0x7FFF),
                half = _mm512_set1_epi32(CompactIndex::kHalf);
  const int* table = reinterpret_cast<const int*>(index.entry);
  int64_t k = 0;
  for (; k + 16 <= len; k += 16) {
    const __m512i bits = _mm512_castps_si512(Scaled16(x + k, vinv));
    const __m512i key = _mm512_and_si512(_mm512_srli_epi32(bits, 16), magnitude);
    const __m512i bucket = _mm512_sub_epi32(_mm512_max_epu32(key, below), below);
    const __m512i negative = _mm512_srai_epi32(bits, 31);
    const __m512i slot = index.has_sign ? _mm512_add_epi32(bucket, _mm512_and_si512(negative, half))
                                        : _mm512_andnot_si512(negative, bucket);
    Store16(codes + k, FromEntries16(_mm512_i32gather_epi32(slot, table, 4), bits));
  }
  return k;
}

// One level of the tree search: n = 2n + (q >= the node's boundary).
__attribute__((target("avx512f,avx512bw"))) inline __m512i Descend(__m512 q, __m512 boundary, __m512i n) {
  const __mmask16 ge = _mm512_cmp_ps_mask(q, boundary, _CMP_GE_OQ);
  const __m512i twice = _mm512_add_epi32(n, n);
  return _mm512_mask_add_epi32(twice, ge, twice, _mm512_set1_epi32(1));
}

__attribute__((target("avx512f,avx512bw"))) int64_t Tree512(const float* x, int64_t len, float inv,
                                                            const ThresholdTree& tree, uint8_t* codes) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512 root = _mm512_set1_ps(tree.nodes[0][0]);
  const __m512 l1 = _mm512_load_ps(tree.nodes[1]), l2 = _mm512_load_ps(tree.nodes[2]),
               l3 = _mm512_load_ps(tree.nodes[3]), l4 = _mm512_load_ps(tree.nodes[4]);
  const __m512 l5a = _mm512_load_ps(tree.nodes[5]), l5b = _mm512_load_ps(tree.nodes[5] + 16);
  __m512 l6[4], l7[8];
  for (int j = 0; j < 4; ++j) l6[j] = _mm512_load_ps(tree.nodes[6] + 16 * j);
  for (int j = 0; j < 8; ++j) l7[j] = _mm512_load_ps(tree.nodes[7] + 16 * j);
  const __m512i bit5 = _mm512_set1_epi32(32), bit6 = _mm512_set1_epi32(64);
  int64_t k = 0;
  for (; k + 16 <= len; k += 16) {
    const __m512 q = Scaled16(x + k, vinv);
    __m512i n = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(q, root, _CMP_GE_OQ), _mm512_set1_epi32(1));
    n = Descend(q, _mm512_permutexvar_ps(n, l1), n);
    n = Descend(q, _mm512_permutexvar_ps(n, l2), n);
    n = Descend(q, _mm512_permutexvar_ps(n, l3), n);
    n = Descend(q, _mm512_permutexvar_ps(n, l4), n);
    n = Descend(q, _mm512_permutex2var_ps(l5a, n, l5b), n);
    {  // 64 nodes: two 32-entry permutes, picked by bit 5 of n
      const __mmask16 hi5 = _mm512_test_epi32_mask(n, bit5);
      n = Descend(
          q,
          _mm512_mask_blend_ps(hi5, _mm512_permutex2var_ps(l6[0], n, l6[1]), _mm512_permutex2var_ps(l6[2], n, l6[3])),
          n);
    }
    {  // 128 nodes: four 32-entry permutes, picked by bits 5 and 6
      const __mmask16 hi5 = _mm512_test_epi32_mask(n, bit5), hi6 = _mm512_test_epi32_mask(n, bit6);
      const __m512 low =
          _mm512_mask_blend_ps(hi5, _mm512_permutex2var_ps(l7[0], n, l7[1]), _mm512_permutex2var_ps(l7[2], n, l7[3]));
      const __m512 high =
          _mm512_mask_blend_ps(hi5, _mm512_permutex2var_ps(l7[4], n, l7[5]), _mm512_permutex2var_ps(l7[6], n, l7[7]));
      n = Descend(q, _mm512_mask_blend_ps(hi6, low, high), n);
    }
    Store16(codes + k, n);
  }
  return k;
}

// The AVX2 bodies (wide and compact; the tree falls back to compact): 8 values at a time.
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

__attribute__((target("avx2,fma"))) int64_t Compact256(const float* x, int64_t len, float inv,
                                                       const CompactIndex& index, uint8_t* codes) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i below = _mm256_set1_epi32(CompactIndex::kLowKey - 1), magnitude = _mm256_set1_epi32(0x7FFF),
                half = _mm256_set1_epi32(CompactIndex::kHalf);
  const int* table = reinterpret_cast<const int*>(index.entry);
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    const __m256i bits = ScaledBits8(x + k, vinv);
    const __m256i key = _mm256_and_si256(_mm256_srli_epi32(bits, 16), magnitude);
    const __m256i bucket = _mm256_sub_epi32(_mm256_max_epu32(key, below), below);
    const __m256i negative = _mm256_srai_epi32(bits, 31);
    const __m256i slot = index.has_sign ? _mm256_add_epi32(bucket, _mm256_and_si256(negative, half))
                                        : _mm256_andnot_si256(negative, bucket);
    Store8(codes + k, FromEntries8(_mm256_i32gather_epi32(table, slot, 4), bits));
  }
  return k;
}

}  // namespace

const char* CodeSearchName(CodeSearch search) {
  switch (search) {
    case CodeSearch::kWide:
      return "wide";
    case CodeSearch::kCompact:
      return "compact";
    case CodeSearch::kTree:
      return "tree";
  }
  return "?";
}

bool ParseCodeSearch(std::string_view name, CodeSearch* search) {
  for (CodeSearch s : {CodeSearch::kWide, CodeSearch::kCompact, CodeSearch::kTree})
    if (name == CodeSearchName(s)) {
      *search = s;
      return true;
    }
  return false;
}

CodeSearch ActiveCodeSearch() { return g_search.load(std::memory_order_relaxed); }
void SetCodeSearch(CodeSearch search) { g_search.store(search, std::memory_order_relaxed); }

void QuantizeScaled(const float* x, int64_t len, float amax, const std::array<float, 256>& map, SimdLevel level,
                    CodeSearch search, uint8_t* codes) {
  const Searches& s = SearchesOf(map);
  const float inv = 1.0f / amax;
  int64_t k = 0;
  if (level == SimdLevel::kAvx512) {
    k = search == CodeSearch::kWide      ? Wide512(x, len, inv, s.wide, codes)
        : search == CodeSearch::kCompact ? Compact512(x, len, inv, s.compact, codes)
                                         : Tree512(x, len, inv, s.tree, codes);
  } else if (level == SimdLevel::kAvx2) {
    k = search == CodeSearch::kWide ? Wide256(x, len, inv, s.wide, codes) : Compact256(x, len, inv, s.compact, codes);
  }
  for (; k < len; ++k) codes[k] = s.Nearest(x[k] * inv, search == CodeSearch::kTree ? CodeSearch::kCompact : search);
}

uint8_t SearchNearestCode(const std::array<float, 256>& map, float x, CodeSearch search) {
  return SearchesOf(map).Nearest(x, search);
}

}  // namespace slide
