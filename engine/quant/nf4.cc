#include "engine/quant/nf4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/common/thread_pool.h"
#include "engine/optim/adamw_8bit.h"

namespace slide {
namespace {

// Midpoints between neighbouring codes, computed in fp32 as bitsandbytes computes its bucket bounds.
const std::array<float, 15>& Nf4Bounds() {
  static const std::array<float, 15> bounds = [] {
    std::array<float, 15> b{};
    const auto& code = Nf4CodeBook();
    for (size_t i = 0; i < b.size(); ++i) b[i] = (code[i] + code[i + 1]) / 2.0f;
    return b;
  }();
  return bounds;
}

}  // namespace

const std::array<float, 16>& Nf4CodeBook() {
  static const std::array<float, 16> code = {
      -1.0f,
      -0.6961928009986877f,
      -0.5250730514526367f,
      -0.39491748809814453f,
      -0.28444138169288635f,
      -0.18477343022823334f,
      -0.09105003625154495f,
      0.0f,
      0.07958029955625534f,
      0.16093020141124725f,
      0.24611230194568634f,
      0.33791524171829224f,
      0.44070982933044434f,
      0.5626170039176941f,
      0.7229568362236023f,
      1.0f,
  };
  return code;
}

Status CheckNf4Numel(int64_t numel, const std::string& what) {
  if (numel <= 0 || numel % kNf4Block != 0)
    return InvalidArgument(what + " has " + std::to_string(numel) +
                           " elements, not a positive multiple of the NF4 block (" + std::to_string(kNf4Block) + ")");
  return Status::Ok();
}

uint8_t Nf4Code(float scaled) {
  // The count of bounds below the value (a branch-free lower_bound over the 15 sorted bounds).
  const auto& bounds = Nf4Bounds();
  int code = 0;
  for (float bound : bounds) code += bound < scaled ? 1 : 0;
  return static_cast<uint8_t>(code);
}

namespace {
void QuantizeNf4Blocks(const float* x, int64_t first, int64_t last, uint8_t* packed, float* absmax) {
  for (int64_t b = first; b < last; ++b) {
    const float* block = x + b * kNf4Block;
    float max_abs = 0;
    for (int64_t i = 0; i < kNf4Block; ++i) max_abs = std::max(max_abs, std::fabs(block[i]));
    absmax[b] = max_abs;
    const float inverse = 1.0f / std::max(max_abs, 1e-38f);
    uint8_t* out = packed + b * (kNf4Block / 2);
    for (int64_t i = 0; i < kNf4Block; i += 2) {
      const uint8_t hi = Nf4Code(std::clamp(block[i] * inverse, -1.0f, 1.0f));
      const uint8_t lo = Nf4Code(std::clamp(block[i + 1] * inverse, -1.0f, 1.0f));
      out[i / 2] = static_cast<uint8_t>(hi << 4 | lo);
    }
  }
}
constexpr int64_t kBlocksPerTask = 4096;  // 256K elements: a layer's projections spread over every core
}  // namespace

void QuantizeNf4(const float* x, int64_t n, uint8_t* packed, float* absmax) {
  const int64_t blocks = n / kNf4Block, tasks = (blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  if (tasks <= 1) return QuantizeNf4Blocks(x, 0, blocks, packed, absmax);
  // Blocks are independent: the result does not depend on how they are split.
  ThreadPool::Default().ParallelFor(tasks, [&](int64_t t) {
    QuantizeNf4Blocks(x, t * kBlocksPerTask, std::min(blocks, (t + 1) * kBlocksPerTask), packed, absmax);
  });
}

float Nf4StatsOffset(const float* absmax, int64_t blocks) {
  double sum = 0;
  for (int64_t i = 0; i < blocks; ++i) sum += absmax[i];
  return blocks == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(blocks));
}

void CompressNf4Stats(const float* absmax, int64_t blocks, float offset, uint8_t* codes, float* absmax2) {
  static_assert(kNf4StatsBlock == kQuantBlock, "the statistics use the 8-bit blockwise quantiser's block");
  std::vector<float> centred(static_cast<size_t>(blocks));
  // Statistics blocks are independent, so tasks of whole ones give the serial result (a 70B layer has 13M scales).
  constexpr int64_t kValuesPerTask = 1024 * kNf4StatsBlock;
  auto task = [&](int64_t t) {
    const int64_t begin = t * kValuesPerTask, end = std::min(blocks, begin + kValuesPerTask);
    for (int64_t i = begin; i < end; ++i) centred[static_cast<size_t>(i)] = absmax[i] - offset;
    QuantizeBlockwise(centred.data() + begin, end - begin, SignedDynamicMap(), codes + begin,
                      absmax2 + begin / kNf4StatsBlock);
  };
  ThreadPool::Default().ParallelFor((blocks + kValuesPerTask - 1) / kValuesPerTask, task);  // one task: inline
}

void ExpandNf4Stats(const uint8_t* codes, const float* absmax2, float offset, int64_t blocks, float* absmax) {
  const auto& map = SignedDynamicMap();
  for (int64_t i = 0; i < blocks; ++i) {
    const float scaled = map[codes[i]] * absmax2[i / kNf4StatsBlock];
    absmax[i] = scaled + offset;
  }
}

namespace {
template <class T>
void DequantizeNf4As(const uint8_t* packed, const float* absmax, int64_t n, T* out) {
  const auto& code = Nf4CodeBook();
  for (int64_t i = 0; i < n; i += 2) {
    const uint8_t byte = packed[i / 2];
    const float scale = absmax[i / kNf4Block];
    out[i] = T(code[byte >> 4] * scale);
    out[i + 1] = T(code[byte & 0xF] * scale);
  }
}
}  // namespace

void DequantizeNf4(const uint8_t* packed, const float* absmax, int64_t n, c10::BFloat16* out) {
  DequantizeNf4As(packed, absmax, n, out);
}
void DequantizeNf4(const uint8_t* packed, const float* absmax, int64_t n, float* out) {
  DequantizeNf4As(packed, absmax, n, out);
}

}  // namespace slide
