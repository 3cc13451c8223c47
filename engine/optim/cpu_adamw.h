// Fused CPU AdamW: one pass per element reads the gradient (bf16 or fp32), updates the fp32 master weight and
// both fp32 moments in place, and writes the bf16 weight the next forward loads. SIMD body (AVX-512 or AVX2,
// chosen at run time) over tiles spread across threads, scalar tail; the arithmetic follows
// torch.optim.AdamW (decoupled decay, bias correction) so results agree with it to float rounding.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "engine/optim/adamw_reference.h"
#include "engine/optim/adamw_scalars.h"

namespace slide {

enum class SimdLevel { kScalar, kAvx2, kAvx512 };
const char* SimdLevelName(SimdLevel level);
SimdLevel DetectSimdLevel();  // best level this CPU supports (SLIDE_SIMD=scalar|avx2|avx512 caps it)

struct AdamWSpan {
  float* param = nullptr;                    // [n] fp32 master, updated in place
  float* exp_avg = nullptr;                  // [n] fp32
  float* exp_avg_sq = nullptr;               // [n] fp32
  const c10::BFloat16* grad_bf16 = nullptr;  // [n] exactly one of grad_bf16 / grad_f32
  const float* grad_f32 = nullptr;
  c10::BFloat16* out_bf16 = nullptr;  // [n] optional: the updated weight rounded to bf16 (nearest even)
  int64_t n = 0;
  // Computes the update but writes only out_bf16 (required then): the master and moments stay as they were, so a
  // later whole update with the same arguments writes the same weights and the new state. The next forward's
  // weights cost 16 bytes an element this way instead of the whole update's 30.
  bool weights_only = false;
};

struct AdamWStepArgs {
  AdamWHyper hp;
  int64_t step = 1;         // 1-based, including this update
  float grad_scale = 1.0f;  // multiplies the gradient first (clipping coefficient)
};

// The scalars of one update (the CUDA kernel takes the same).
AdamWScalars MakeAdamWScalars(const AdamWStepArgs& args);

// Updates one span: on the calling thread when `threads` == 1, else across ThreadPool::Default().
void CpuAdamW(const AdamWSpan& span, const AdamWStepArgs& args, SimdLevel level, int threads = 0);

}  // namespace slide
