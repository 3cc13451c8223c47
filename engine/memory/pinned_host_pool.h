// PinnedHostPool: host buffers a device copies from and into asynchronously. Whole, aligned pages (two buffers never
// share a page, which cudaHostRegister would refuse as registered twice), page-locked with cudaHostRegister when
// the pool locks (a CUDA device) rather than through LibTorch's pinned allocator, which rounds each block up to a
// power of two (384 MiB would take 512). Each buffer is unlocked and freed when its last tensor goes, so buffers
// may outlive the pool.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <atomic>
#include <cstdint>
#include <memory>

namespace slide {

class PinnedHostPool {
 public:
  explicit PinnedHostPool(bool page_lock);
  // Uninitialised numel elements of dtype. Throws c10::Error when the host is out of memory or the lock fails.
  at::Tensor Allocate(int64_t numel, c10::ScalarType dtype);
  int64_t locked_bytes() const { return locked_bytes_->load(); }  // page-locked and alive (0 when not locking)

 private:
  bool page_lock_;
  std::shared_ptr<std::atomic<int64_t>> locked_bytes_;  // shared with the buffers' deleters
};

}  // namespace slide
