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
  // Seconds in the segments; with `spans`, each segment on the host clock: `end` completed at `end_host`.
  static double Sum(std::vector<std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>>& v, const char* lane,
                    std::vector<TraceSpan>* spans, Event* end, double end_host) {
    double ms = 0;
    for (auto& [a, b] : v) {
      const double seg_ms = a->elapsed_time(*b);
      ms += seg_ms;
      if (spans != nullptr) {
        const double t1 = end_host - b->elapsed_time(*end) / 1e3;
        spans->push_back({lane, lane + 4, t1 - seg_ms / 1e3, t1});
      }
    }
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
  const double t0 = TraceNow();
  dst.copy_(src);
  cpu_busy_.h2d += TraceNow() - t0;
  cpu_spans_.push_back({"gpu.h2d", "h2d", t0, TraceNow()});
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
  const double t0 = TraceNow();
  dst.copy_(src);
  cpu_busy_.d2h += TraceNow() - t0;
  cpu_spans_.push_back({"gpu.d2h", "d2h", t0, TraceNow()});
  return [] {};
}

void DeviceQueue::BeginCompute() {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    cuda_->compute_start = Cuda::Mark(cuda_->compute);
    return;
  }
#endif
  compute_t0_ = TraceNow();
}

void DeviceQueue::EndCompute() {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    cuda_->t_compute.emplace_back(cuda_->compute_start, Cuda::Mark(cuda_->compute));
    return;
  }
#endif
  cpu_busy_.compute += TraceNow() - compute_t0_;
  cpu_spans_.push_back({"gpu.compute", "compute", compute_t0_, TraceNow()});
}

QueueBusy DeviceQueue::TakeBusy(std::vector<TraceSpan>* spans) {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    c10::cuda::device_synchronize();
    // Every event has completed; one recorded now completes at once, which pins the device clock to the host's.
    Cuda::Event end(cudaEventDefault);
    end.record(cuda_->compute);
    end.synchronize();
    const double end_host = TraceNow();
    QueueBusy b;
    b.compute = Cuda::Sum(cuda_->t_compute, "gpu.compute", spans, &end, end_host);
    b.h2d = Cuda::Sum(cuda_->t_h2d, "gpu.h2d", spans, &end, end_host);
    b.d2h = Cuda::Sum(cuda_->t_d2h, "gpu.d2h", spans, &end, end_host);
    return b;
  }
#endif
  if (spans != nullptr) spans->insert(spans->end(), cpu_spans_.begin(), cpu_spans_.end());
  cpu_spans_.clear();
  return std::exchange(cpu_busy_, QueueBusy{});
}

}  // namespace slide
