#include "engine/memory/pinned_host_pool.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

#if SLIDE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace slide {
namespace {

// "" when locked, else the reason (CUDA's error, cleared so that no later launch check reports it).
std::string Lock(void* p, size_t bytes) {
#if SLIDE_HAVE_CUDA
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e == cudaSuccess) return "";
  (void)cudaGetLastError();
  return cudaGetErrorString(e);
#else
  (void)p, (void)bytes;
  return "no CUDA in this build";
#endif
}

void Unlock(void* p) {
#if SLIDE_HAVE_CUDA
  (void)cudaHostUnregister(p);  // at exit the driver may already be gone; the memory is freed either way
#else
  (void)p;
#endif
}

}  // namespace

PinnedHostPool::PinnedHostPool(bool page_lock)
    : page_lock_(page_lock), locked_bytes_(std::make_shared<std::atomic<int64_t>>(0)) {
#if !SLIDE_HAVE_CUDA
  TORCH_CHECK(!page_lock, "this build has no CUDA support to page-lock host memory with");
#endif
}

at::Tensor PinnedHostPool::Allocate(int64_t numel, c10::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  const size_t rounded = (bytes + page - 1) / page * page;
  if (rounded == 0) return at::empty({numel}, options);
  void* p = std::aligned_alloc(page, rounded);
  TORCH_CHECK(p != nullptr, "out of host memory allocating ", rounded, " bytes");
  if (!page_lock_)
    return at::from_blob(
        p, {numel}, [](void* q) { std::free(q); }, options);
  if (const std::string error = Lock(p, bytes); !error.empty()) {
    std::free(p);
    TORCH_CHECK(false, "page-locking ", bytes, " bytes of host memory failed: ", error);
  }
  *locked_bytes_ += static_cast<int64_t>(bytes);
  auto counter = locked_bytes_;
  return at::from_blob(
      p, {numel},
      [counter, bytes](void* q) {
        Unlock(q);
        *counter -= static_cast<int64_t>(bytes);
        std::free(q);
      },
      options);
}

}  // namespace slide
