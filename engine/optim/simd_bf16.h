// fp32 -> bf16 for the SIMD bodies of the CPU optimizers: round to nearest even, NaN to the quiet NaN 0x7FC0, as
// FloatToBf16Bits (bf16_bits.h) does element by element.
#pragma once

#include <immintrin.h>

namespace slide {

__attribute__((target("avx2,fma"))) inline __m128i ToBf16x8(__m256 p) {
  __m256i bits = _mm256_castps_si256(p);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  // pack 8 x u32 (values < 2^16) into 8 x u16
  __m128i lo = _mm256_castsi256_si128(rounded), hi = _mm256_extracti128_si256(rounded, 1);
  return _mm_packus_epi32(lo, hi);
}

__attribute__((target("avx512f,avx512bw"))) inline __m256i ToBf16x16(__m512 p) {
  __m512i bits = _mm512_castps_si512(p);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(rounded);
}

}  // namespace slide
