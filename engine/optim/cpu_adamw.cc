#include "engine/optim/cpu_adamw.h"

#include <c10/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/common/thread_pool.h"
#include "engine/optim/bf16_bits.h"
#include "engine/optim/simd_bf16.h"

namespace slide {
namespace {

// The scalar path; also the tail of the SIMD paths. Operation order mirrors torch's single-tensor AdamW.
void ScalarRange(const AdamWSpan& s, const AdamWScalars& c, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float g = (s.grad_bf16 ? Bf16ToFloat(s.grad_bf16[i]) : s.grad_f32[i]) * c.grad_scale;
    float p = s.param[i] * c.decay;
    float m = s.exp_avg[i];
    m = m + c.one_minus_b1 * (g - m);
    float v = s.exp_avg_sq[i] * c.b2 + c.one_minus_b2 * (g * g);
    float denom = std::sqrt(v) / c.bc2_sqrt + c.eps;
    p = p - c.step_size * (m / denom);
    if (!s.weights_only) {
      s.param[i] = p;
      s.exp_avg[i] = m;
      s.exp_avg_sq[i] = v;
    }
    if (s.out_bf16) s.out_bf16[i].x = FloatToBf16Bits(p);
  }
}

// The SIMD bodies write the bf16 weights with non-temporal stores: nothing on the CPU reads them again (the next
// H2D copy does), so they need not pull each line into the cache first (2 of the weights-only pass's 18 bytes an
// element) nor evict the state the update streams through. Those stores want aligned addresses: the scalar path takes
// the elements before the first aligned one and returns where the SIMD body starts.
inline int64_t AlignOutput(const AdamWSpan& s, const AdamWScalars& c, int64_t begin, int64_t end, int64_t align) {
  if (!s.out_bf16) return begin;
  const auto addr = reinterpret_cast<uintptr_t>(s.out_bf16 + begin);
  const int64_t head = std::min<int64_t>(end - begin, ((align - addr % align) % align) / sizeof(c10::BFloat16));
  ScalarRange(s, c, begin, begin + head);
  return begin + head;
}

__attribute__((target("avx2,fma"))) inline __m256 LoadGrad8(const AdamWSpan& s, int64_t i) {
  if (s.grad_bf16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.grad_bf16 + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(s.grad_f32 + i);
}

__attribute__((target("avx2,fma"))) void Avx2Range(const AdamWSpan& s, const AdamWScalars& c, int64_t begin,
                                                   int64_t end) {
  const __m256 decay = _mm256_set1_ps(c.decay), w1 = _mm256_set1_ps(c.one_minus_b1), b2 = _mm256_set1_ps(c.b2),
               w2 = _mm256_set1_ps(c.one_minus_b2), step = _mm256_set1_ps(c.step_size),
               bc2 = _mm256_set1_ps(c.bc2_sqrt), eps = _mm256_set1_ps(c.eps), gs = _mm256_set1_ps(c.grad_scale);
  const bool keep_state = !s.weights_only;
  int64_t i = AlignOutput(s, c, begin, end, 16);
  for (; i + 8 <= end; i += 8) {
    __m256 g = _mm256_mul_ps(LoadGrad8(s, i), gs);
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(s.param + i), decay);
    __m256 m = _mm256_loadu_ps(s.exp_avg + i);
    m = _mm256_add_ps(m, _mm256_mul_ps(w1, _mm256_sub_ps(g, m)));
    __m256 v =
        _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s.exp_avg_sq + i), b2), _mm256_mul_ps(w2, _mm256_mul_ps(g, g)));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2), eps);
    p = _mm256_sub_ps(p, _mm256_mul_ps(step, _mm256_div_ps(m, denom)));
    if (keep_state) {
      _mm256_storeu_ps(s.param + i, p);
      _mm256_storeu_ps(s.exp_avg + i, m);
      _mm256_storeu_ps(s.exp_avg_sq + i, v);
    }
    if (s.out_bf16) _mm_stream_si128(reinterpret_cast<__m128i*>(s.out_bf16 + i), ToBf16x8(p));
  }
  if (s.out_bf16) _mm_sfence();
  ScalarRange(s, c, i, end);
}

__attribute__((target("avx512f,avx512bw"))) inline __m512 LoadGrad16(const AdamWSpan& s, int64_t i) {
  if (s.grad_bf16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.grad_bf16 + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_loadu_ps(s.grad_f32 + i);
}

__attribute__((target("avx512f,avx512bw"))) void Avx512Range(const AdamWSpan& s, const AdamWScalars& c, int64_t begin,
                                                             int64_t end) {
  const __m512 decay = _mm512_set1_ps(c.decay), w1 = _mm512_set1_ps(c.one_minus_b1), b2 = _mm512_set1_ps(c.b2),
               w2 = _mm512_set1_ps(c.one_minus_b2), step = _mm512_set1_ps(c.step_size),
               bc2 = _mm512_set1_ps(c.bc2_sqrt), eps = _mm512_set1_ps(c.eps), gs = _mm512_set1_ps(c.grad_scale);
  const bool keep_state = !s.weights_only;
  int64_t i = AlignOutput(s, c, begin, end, 32);
  for (; i + 16 <= end; i += 16) {
    __m512 g = _mm512_mul_ps(LoadGrad16(s, i), gs);
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(s.param + i), decay);
    __m512 m = _mm512_loadu_ps(s.exp_avg + i);
    m = _mm512_add_ps(m, _mm512_mul_ps(w1, _mm512_sub_ps(g, m)));
    __m512 v =
        _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(s.exp_avg_sq + i), b2), _mm512_mul_ps(w2, _mm512_mul_ps(g, g)));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2), eps);
    p = _mm512_sub_ps(p, _mm512_mul_ps(step, _mm512_div_ps(m, denom)));
    if (keep_state) {
      _mm512_storeu_ps(s.param + i, p);
      _mm512_storeu_ps(s.exp_avg + i, m);
      _mm512_storeu_ps(s.exp_avg_sq + i, v);
    }
    if (s.out_bf16) _mm256_stream_si256(reinterpret_cast<__m256i*>(s.out_bf16 + i), ToBf16x16(p));
  }
  if (s.out_bf16) _mm_sfence();
  ScalarRange(s, c, i, end);
}

constexpr int64_t kTileElems = 1 << 16;  // 256 KiB of fp32 per stream per tile: large enough to amortise
                                         // scheduling, small enough to balance threads

}  // namespace

AdamWScalars MakeAdamWScalars(const AdamWStepArgs& a) {
  const double t = static_cast<double>(a.step);
  AdamWScalars c;
  c.decay = static_cast<float>(1.0 - a.hp.lr * a.hp.weight_decay);
  c.one_minus_b1 = static_cast<float>(1.0 - a.hp.beta1);
  c.b2 = static_cast<float>(a.hp.beta2);
  c.one_minus_b2 = static_cast<float>(1.0 - a.hp.beta2);
  c.step_size = static_cast<float>(a.hp.lr / (1.0 - std::pow(a.hp.beta1, t)));
  c.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(a.hp.beta2, t)));
  c.eps = static_cast<float>(a.hp.eps);
  c.grad_scale = a.grad_scale;
  return c;
}

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

SimdLevel DetectSimdLevel() {
  SimdLevel best = SimdLevel::kScalar;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = SimdLevel::kAvx2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) best = SimdLevel::kAvx512;
  if (const char* cap = std::getenv("SLIDE_SIMD")) {
    const std::string c(cap);
    if (c == "scalar") best = SimdLevel::kScalar;
    if (c == "avx2" && best == SimdLevel::kAvx512) best = SimdLevel::kAvx2;
  }
  return best;
}

void CpuAdamW(const AdamWSpan& span, const AdamWStepArgs& args, SimdLevel level, int threads) {
  TORCH_CHECK((span.grad_bf16 == nullptr) != (span.grad_f32 == nullptr), "CpuAdamW: give exactly one gradient");
  TORCH_CHECK(!span.weights_only || span.out_bf16 != nullptr, "CpuAdamW: a weights-only update needs out_bf16");
  const AdamWScalars c = MakeAdamWScalars(args);
  auto range = level == SimdLevel::kAvx512 ? Avx512Range : level == SimdLevel::kAvx2 ? Avx2Range : ScalarRange;
  const int64_t tiles = (span.n + kTileElems - 1) / kTileElems;
  auto run_tile = [&](int64_t t) { range(span, c, t * kTileElems, std::min(span.n, (t + 1) * kTileElems)); };
  if (threads == 1 || tiles == 1) {
    for (int64_t t = 0; t < tiles; ++t) run_tile(t);
    return;
  }
  ThreadPool::Default().ParallelFor(tiles, run_tile);
}

}  // namespace slide
