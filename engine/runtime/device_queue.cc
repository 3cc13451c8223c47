#include "engine/runtime/device_queue.h"

#include <ATen/ops/empty.h>

#include <chrono>
#include <utility>
#include <vector>

#if SLIDE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace slide {
namespace {
double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

#if SLIDE_HAVE_CUDA
struct DeviceQueue::Cuda {
  using Event = c10::cuda::CUDAEvent;
  c10::cuda::CUDAStream compute, h2d, d2h;
  std::vector<Event> loaded, released;
  std::vector<bool> released_recorded;
  // Timing pairs per resource.
  std::vector<std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>> t_compute, t_h2d, t_d2h;
  std::shared_ptr<Event> compute_start;

  Cuda(c10::Device device, int slots)
      : compute(c10::cuda::getCurrentCUDAStream(device.index())),
        h2d(c10::cuda::getStreamFromPool(false, device.index())),
        d2h(c10::cuda::getStreamFromPool(false, device.index())),
        released_recorded(slots, false) {
    for (int i = 0; i < slots; ++i) {
      loaded.emplace_back();
      released.emplace_back();
    }
  }
  static std::shared_ptr<Event> Mark(const c10::cuda::CUDAStream& s) {
    auto e = std::make_shared<Event>(cudaEventDefault);
    e->record(s);
    return e;
  }
  static double Sum(std::vector<std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>>& v) {
    double ms = 0;
    for (auto& [a, b] : v) ms += a->elapsed_time(*b);
    v.clear();
    return ms / 1e3;
  }
};
#else
struct DeviceQueue::Cuda {};
#endif

DeviceQueue::DeviceQueue(c10::Device device, int num_slots) {
#if SLIDE_HAVE_CUDA
  if (device.is_cuda()) cuda_ = std::make_unique<Cuda>(device, num_slots);
#else
  TORCH_CHECK(!device.is_cuda(), "this build has no CUDA support");
#endif
}

DeviceQueue::~DeviceQueue() {
#if SLIDE_HAVE_CUDA
  for (void* p : registered_) (void)cudaHostUnregister(p);
#endif
}

at::Tensor DeviceQueue::AllocateHost(int64_t numel, c10::ScalarType dtype) {
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
#if SLIDE_HAVE_CUDA
  if (cuda_ && t.nbytes() > 0) {
    C10_CUDA_CHECK(cudaHostRegister(t.data_ptr(), t.nbytes(), cudaHostRegisterDefault));
    registered_.push_back(t.data_ptr());
    pinned_bytes_ += static_cast<int64_t>(t.nbytes());
  }
#endif
  return t;
}

void DeviceQueue::LoadSlot(int slot, at::Tensor dst, const at::Tensor& src) {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    auto& c = *cuda_;
    if (c.released_recorded[slot]) c.released[slot].block(c.h2d);
    c10::cuda::CUDAStreamGuard guard(c.h2d);
    auto t0 = Cuda::Mark(c.h2d);
    dst.copy_(src, /*non_blocking=*/true);
    c.t_h2d.emplace_back(t0, Cuda::Mark(c.h2d));
    c.loaded[slot].record(c.h2d);
    return;
  }
#endif
  const double t0 = Now();
  dst.copy_(src);
  cpu_busy_.h2d += Now() - t0;
}

void DeviceQueue::UseSlot(int slot) {
#if SLIDE_HAVE_CUDA
  if (cuda_ && cuda_->loaded[slot].isCreated()) cuda_->loaded[slot].block(cuda_->compute);
#endif
}

void DeviceQueue::ReleaseSlot(int slot) {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    cuda_->released[slot].record(cuda_->compute);
    cuda_->released_recorded[slot] = true;
  }
#endif
}

std::function<void()> DeviceQueue::Offload(at::Tensor dst, const at::Tensor& src) {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    auto& c = *cuda_;
    auto ready = Cuda::Mark(c.compute);
    ready->block(c.d2h);
    c10::cuda::CUDAStreamGuard guard(c.d2h);
    auto t0 = Cuda::Mark(c.d2h);
    dst.copy_(src, /*non_blocking=*/true);
    // src was made on the compute stream; keep its memory from reuse until the D2H stream is done with it.
    c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), c.d2h);
    auto done = Cuda::Mark(c.d2h);
    c.t_d2h.emplace_back(t0, done);
    return [done] { done->synchronize(); };
  }
#endif
  const double t0 = Now();
  dst.copy_(src);
  cpu_busy_.d2h += Now() - t0;
  return [] {};
}

void DeviceQueue::BeginCompute() {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    cuda_->compute_start = Cuda::Mark(cuda_->compute);
    return;
  }
#endif
  compute_t0_ = Now();
}

void DeviceQueue::EndCompute() {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    cuda_->t_compute.emplace_back(cuda_->compute_start, Cuda::Mark(cuda_->compute));
    return;
  }
#endif
  cpu_busy_.compute += Now() - compute_t0_;
}

QueueBusy DeviceQueue::TakeBusy() {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    c10::cuda::device_synchronize();
    QueueBusy b;
    b.compute = Cuda::Sum(cuda_->t_compute);
    b.h2d = Cuda::Sum(cuda_->t_h2d);
    b.d2h = Cuda::Sum(cuda_->t_d2h);
    return b;
  }
#endif
  return std::exchange(cpu_busy_, QueueBusy{});
}

}  // namespace slide
