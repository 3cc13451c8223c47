// AdamW with blockwise 8-bit moments (bitsandbytes' method; a job's `optimizer: adamw_8bit`). Each moment is kept as
// one byte an element plus an fp32 absmax per block of 256 elements: a code indexes a 256-entry dynamic map of values
// in [-1, 1] (signed for the first moment, unsigned for the second), scaled by the block's absmax. An update
// dequantises a block, runs the fp32 AdamW of cpu_adamw.cc on it element by element (the same scalars and order), takes
// the block's new absmax and requantises each moment to the nearest code. The fp32 master is kept. Blocks are
// independent, so the result does not depend on how a span is split into tiles or threads.
#pragma once

#include <c10/util/BFloat16.h>

#include <array>
#include <cstdint>

#include "engine/optim/cpu_adamw.h"

namespace slide {

inline constexpr int64_t kQuantBlock = 256;          // elements that share one absmax
inline constexpr int64_t kMin8BitStateNumel = 4096;  // smaller parameters keep fp32 moments (as bitsandbytes does)

// The dynamic maps, 256 sorted codes (dynamic_maps.cc, generated from bitsandbytes).
const std::array<float, 256>& SignedDynamicMap();    // [-1, 1]: the first moment
const std::array<float, 256>& UnsignedDynamicMap();  // [0, 1]: the second moment

// The code nearest to x (clamped to [-1, 1]) in a sorted map; an exact midpoint goes to the lower code.
uint8_t NearestCode(const std::array<float, 256>& map, float x);
// `n` values in blocks of kQuantBlock (the last may be shorter): absmax[b] = max |x| over block b (ceil(n / 256)
// of them), codes[i] = NearestCode(x[i] * (1 / absmax)); a block of zeros gets absmax 0 and code 0. (The update
// finds codes through code_search.h's tables, NearestCode's codes bit for bit.)
void QuantizeBlockwise(const float* x, int64_t n, const std::array<float, 256>& map, uint8_t* codes, float* absmax);
void DequantizeBlockwise(const uint8_t* codes, const float* absmax, int64_t n, const std::array<float, 256>& map,
                         float* out);

// One parameter's update. Every pointer is at the parameter's first element (its blocks start there); absmax arrays
// hold ceil(n / 256) entries.
struct AdamW8bitSpan {
  float* param = nullptr;      // [n] fp32 master, updated in place
  uint8_t* exp_avg = nullptr;  // [n] codes of the signed map
  float* exp_avg_absmax = nullptr;
  uint8_t* exp_avg_sq = nullptr;  // [n] codes of the unsigned map
  float* exp_avg_sq_absmax = nullptr;
  const c10::BFloat16* grad_bf16 = nullptr;  // [n] exactly one of grad_bf16 / grad_f32
  const float* grad_f32 = nullptr;
  c10::BFloat16* out_bf16 = nullptr;  // [n] optional: the updated weight rounded to bf16
  int64_t n = 0;
};

// On the calling thread when `threads` == 1, else tiles of whole blocks across ThreadPool::Default(). The AVX-512 and
// AVX2 bodies (as `level` says) are bit-identical to the scalar path.
void CpuAdamW8bit(const AdamW8bitSpan& span, const AdamWStepArgs& args, SimdLevel level, int threads = 0);

// The weights-only pass (see AdamWSpan::weights_only) over elements [lo, hi) of the parameter `span` describes
// (its pointers at the parameter's first element; out_bf16 unused): each element's updated weight, computed
// exactly as CpuAdamW8bit computes it, rounded to bf16 into out[0, hi - lo). The state is only read.
void CpuAdamW8bitWeightsOnly(const AdamW8bitSpan& span, int64_t lo, int64_t hi, c10::BFloat16* out,
                             const AdamWStepArgs& args, SimdLevel level, int threads = 0);

}  // namespace slide
