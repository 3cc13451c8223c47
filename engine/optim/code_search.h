// Finding each value's nearest code in a dynamic map (adamw_8bit.h), the inner step of requantising a block. Every
// search gives NearestCode's code bit for bit (adamw_8bit_test checks each against it); they differ only in speed:
//   wide     a table of 2^16 entries (256 KB a map) indexed by the float's top 16 bits: one gather a vector, from L2
//   compact  the same buckets for magnitudes 2^-24..1 only (25 KB signed, 12 KB unsigned): one gather, from L1
//   tree     a branch-free binary search over the 255 code boundaries held in registers (AVX-512 permutes, no
//            memory gather; the update then also dequantises by permutes of the maps instead of gathers); on AVX2
//            and the scalar path it falls back to compact
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "engine/optim/cpu_adamw.h"

namespace slide {

enum class CodeSearch { kWide, kCompact, kTree };
const char* CodeSearchName(CodeSearch search);
bool ParseCodeSearch(std::string_view name, CodeSearch* search);

// The search the 8-bit update uses (process-wide; benchmarks compare them, jobs keep the default).
CodeSearch ActiveCodeSearch();
void SetCodeSearch(CodeSearch search);

// codes[k] = NearestCode(map, x[k] * (1 / amax)) for k < len, amax > 0; `map` is one of the two dynamic maps.
void QuantizeScaled(const float* x, int64_t len, float amax, const std::array<float, 256>& map, SimdLevel level,
                    CodeSearch search, uint8_t* codes);

// One value by `search`'s tables (the scalar path): NearestCode's code.
uint8_t SearchNearestCode(const std::array<float, 256>& map, float x, CodeSearch search);

}  // namespace slide
