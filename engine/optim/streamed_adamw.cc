#include "engine/optim/streamed_adamw.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "engine/optim/tensor_adamw.h"

namespace slide {

AdamWRing::AdamWRing(c10::Device device, int64_t chunk, int ring, SimdLevel simd) : chunk_(chunk), simd_(simd) {
  TORCH_CHECK(chunk > 0 && ring >= 2, "streamed updates need a chunk and at least two ring slots");
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  for (int r = 0; r < ring; ++r) {
    state_.push_back(at::empty({3 * chunk}, f32));
    grad_.push_back(at::empty({chunk}, f32));
    out_.push_back(at::zeros({chunk}, f32.dtype(at::kBFloat16)));  // never stale bits in the padding it returns
  }
}

at::Tensor AdamWRing::grad(int slot, c10::ScalarType dtype) {
  return dtype == at::kBFloat16 ? grad_[slot].view(at::kBFloat16).narrow(0, 0, chunk_) : grad_[slot];
}

void AdamWRing::Run(int slot, int64_t begin, int64_t len, const HostUnitUpdate& u) {
  const at::Tensor& state = state_[slot];
  const at::Tensor g = grad(slot, u.grad.scalar_type());
  for (const auto& r : u.ranges) {
    const int64_t lo = std::max(begin, r.offset), hi = std::min(begin + len, r.offset + r.numel);
    if (lo >= hi) continue;
    const int64_t off = lo - begin, k = hi - lo;
    TensorAdamW(state.narrow(0, off, k), state.narrow(0, chunk_ + off, k), state.narrow(0, 2 * chunk_ + off, k),
                g.narrow(0, off, k), u.out.defined() ? out_[slot].narrow(0, off, k) : at::Tensor(), r.args, simd_);
  }
}

}  // namespace slide
