// NF4, bitsandbytes' 4-bit NormalFloat format (QLoRA): a frozen base weight kept as 4-bit codes into a table of 16
// values in [-1, 1] (quantiles of a normal distribution), scaled per block of 64 elements by the block's absmax.
// With double quantisation the per-block absmax values are themselves stored 8-bit: less their mean (the offset),
// blockwise in blocks of 256 with the signed dynamic map and an fp32 absmax per block, as bitsandbytes'
// quantize_4bit(compress_statistics=True) stores them. Every routine here reproduces bitsandbytes' arithmetic
// (nf4_test.cc compares bytes and values with fixtures it produced), so a checkpoint quantised by either reads the
// same. CPU code on plain arrays; the CUDA dequantisation is engine/kernels/nf4.cu, bit-identical to Dequantize.
#pragma once

#include <c10/util/BFloat16.h>

#include <array>
#include <cstdint>
#include <string>

#include "engine/common/status.h"

namespace slide {

inline constexpr int64_t kNf4Block = 64;        // elements per absmax
inline constexpr int64_t kNf4StatsBlock = 256;  // absmax values per second-level absmax (double quantisation)

// The 16 NF4 values, ascending (bitsandbytes' get_4bit_type("nf4")).
const std::array<float, 16>& Nf4CodeBook();

// A weight's NF4 encoding is defined for element counts that fill whole blocks: INVALID_ARGUMENT naming `what`
// (the weight) otherwise.
Status CheckNf4Numel(int64_t numel, const std::string& what);

// The code of a value already scaled into [-1, 1]: the number of midpoints between neighbouring codes that lie
// below it, so a value exactly on a midpoint takes the lower code (torch.bucketize, as bitsandbytes quantises).
uint8_t Nf4Code(float scaled);

// Quantises x [n] (n a multiple of 64): absmax[b] = max |x| over block b ([n / 64]); each element's code is
// Nf4Code(clamp(x * (1 / max(absmax, 1e-38)), -1, 1)); packed [n / 2] holds element 2i in the high nibble of byte i and
// element 2i + 1 in the low one.
void QuantizeNf4(const float* x, int64_t n, uint8_t* packed, float* absmax);

// Double quantisation of `blocks` absmax values: `offset` (their mean) is subtracted and the rest stored as codes
// [blocks] of the signed dynamic map with absmax2 [ceil(blocks / 256)]. Nf4StatsOffset is the mean as this code
// computes it (in double, rounded once); bitsandbytes' torch mean sums in another order and may differ in the last
// bit, which changes nothing downstream because the offset is stored with the codes.
float Nf4StatsOffset(const float* absmax, int64_t blocks);
void CompressNf4Stats(const float* absmax, int64_t blocks, float offset, uint8_t* codes, float* absmax2);
// The absmax values back: absmax[i] = map[codes[i]] * absmax2[i / 256] + offset, each operation rounded to fp32 in
// that order (bitsandbytes' dequantize_blockwise, then the offset added).
void ExpandNf4Stats(const uint8_t* codes, const float* absmax2, float offset, int64_t blocks, float* absmax);

// out [n] = NF4[code] * absmax[i / 64], the product in fp32 (rounded to nearest even for bf16 output).
void DequantizeNf4(const uint8_t* packed, const float* absmax, int64_t n, c10::BFloat16* out);
void DequantizeNf4(const uint8_t* packed, const float* absmax, int64_t n, float* out);

}  // namespace slide
