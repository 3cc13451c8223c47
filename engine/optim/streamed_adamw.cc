#include "engine/optim/streamed_adamw.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "engine/optim/adamw_8bit.h"
#include "engine/optim/tensor_adamw.h"
#include "engine/optim/unit_adamw.h"

namespace slide {
namespace {

// Where an 8-bit chunk's moments lie in a slot's moment region (bytes): a quantised parameter's absmax first, then
// its codes after room for a full chunk's blocks; a small parameter's fp32 values from the start.
MomentLayout::Param SlotMoments(bool quantized, int64_t chunk) {
  return {.quantized = quantized, .values = quantized ? 4 * MomentLayout::Blocks(chunk) : 0, .absmax = 0};
}

}  // namespace

std::vector<StreamChunk> PlanStreamChunks(const HostUnitUpdate& u, int64_t chunk) {
  std::vector<StreamChunk> chunks;
  if (u.optimizer == OptimizerKind::kAdamW) {
    const int64_t n = u.master.numel();
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t len = std::min(chunk, n - b);
      chunks.push_back({.begin = b, .len = len, .moment_bytes = {{.host = 4 * b, .slot = 0, .size = 4 * len}}});
    }
    return chunks;
  }
  const int64_t quantized_step = chunk / kQuantBlock * kQuantBlock;
  TORCH_CHECK(quantized_step > 0, "streamed 8-bit updates need chunks of at least ", kQuantBlock, " elements");
  for (size_t r = 0; r < u.ranges.size(); ++r) {
    const HostUnitUpdate::Range& range = u.ranges[r];
    const MomentLayout::Param& where = range.moments;
    const int64_t step = where.quantized ? quantized_step : chunk;
    for (int64_t o = 0; o < range.numel; o += step) {
      StreamChunk c{.begin = range.offset + o,
                    .len = std::min(step, range.numel - o),
                    .range = static_cast<int>(r),
                    .moment_bytes = {}};
      const MomentLayout::Param slot = SlotMoments(where.quantized, chunk);
      if (where.quantized) {  // whole blocks from the parameter's first element: its absmax entries, then its codes
        c.moment_bytes.push_back({.host = where.absmax + 4 * (o / kQuantBlock),
                                  .slot = slot.absmax,
                                  .size = 4 * MomentLayout::Blocks(c.len)});
        c.moment_bytes.push_back({.host = where.values + o, .slot = slot.values, .size = c.len});
      } else {
        c.moment_bytes.push_back({.host = where.values + 4 * o, .slot = slot.values, .size = 4 * c.len});
      }
      chunks.push_back(std::move(c));
    }
  }
  return chunks;
}

AdamWRing::AdamWRing(c10::Device device, int64_t chunk, int ring, SimdLevel simd) : chunk_(chunk), simd_(simd) {
  TORCH_CHECK(chunk > 0 && ring >= 2, "streamed updates need a chunk and at least two ring slots");
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  for (int r = 0; r < ring; ++r) {
    state_.push_back(at::empty({3 * chunk}, f32));
    grad_.push_back(at::empty({chunk}, f32));
    out_.push_back(at::zeros({chunk}, f32.dtype(at::kBFloat16)));  // never stale bits in the padding it returns
  }
}

at::Tensor AdamWRing::moment_bytes(int slot, int which) {
  return state_[slot].narrow(0, (1 + which) * chunk_, chunk_).view(at::kByte);
}

at::Tensor AdamWRing::grad(int slot, c10::ScalarType dtype) {
  return dtype == at::kBFloat16 ? grad_[slot].view(at::kBFloat16).narrow(0, 0, chunk_) : grad_[slot];
}

void AdamWRing::Run(int slot, const StreamChunk& c, const HostUnitUpdate& u) {
  const at::Tensor g = grad(slot, u.grad.scalar_type());
  if (u.optimizer == OptimizerKind::kAdamW) {
    const at::Tensor& state = state_[slot];
    for (const auto& r : u.ranges) {
      const int64_t lo = std::max(c.begin, r.offset), hi = std::min(c.begin + c.len, r.offset + r.numel);
      if (lo >= hi) continue;
      const int64_t off = lo - c.begin, k = hi - lo;
      TensorAdamW(state.narrow(0, off, k), state.narrow(0, chunk_ + off, k), state.narrow(0, 2 * chunk_ + off, k),
                  g.narrow(0, off, k), u.out.defined() ? out_[slot].narrow(0, off, k) : at::Tensor(), r.args, simd_);
    }
    return;
  }
  const HostUnitUpdate::Range& r = u.ranges.at(static_cast<size_t>(c.range));
  ParamAdamW(SlotMoments(r.moments.quantized, chunk_), master(slot).narrow(0, 0, c.len), moment_bytes(slot, 0),
             moment_bytes(slot, 1), g.narrow(0, 0, c.len),
             u.out.defined() ? out_[slot].narrow(0, 0, c.len) : at::Tensor(), r.args, simd_);
}

}  // namespace slide
