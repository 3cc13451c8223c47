// Requantising a block's moments: each value's nearest code in a dynamic map (adamw_8bit.h), found through an index
// of the float's top 16 bits (a "bucket" of 2^16 floats; 256 KB a map): one table read a value where the binary
// search of NearestCode takes eight. It gives NearestCode's code bit for bit (adamw_8bit_test checks every bucket's
// ends, every code and midpoint). A compact index (only the buckets of magnitudes 2^-24..1, in L1) and a branch-free
// search over the code boundaries in registers were measured slower on the GPU box (bench/RESULTS.md, "8-bit AdamW:
// the CPU kernel").
#pragma once

#include <array>
#include <cstdint>

#include "engine/optim/cpu_adamw.h"

namespace slide {

// NearestCode(map, x) through the index; `map` is one of the two dynamic maps.
uint8_t IndexedNearestCode(const std::array<float, 256>& map, float x);

// codes[k] = NearestCode(map, x[k] * (1 / amax)) for k < len, amax > 0, by the SIMD body of `level`.
void QuantizeScaled(const float* x, int64_t len, float amax, const std::array<float, 256>& map, SimdLevel level,
                    uint8_t* codes);

}  // namespace slide
