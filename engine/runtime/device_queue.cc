#include "engine/runtime/device_queue.h"

#include "engine/optim/tensor_adamw.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
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
  c10::cuda::CUDAStream up, down;  // streamed updates
  std::vector<Event> loaded, released;
  std::vector<bool> released_recorded;
  // Parked layer inputs, per layer: its D2H copy landed (parked) and its H2D copy back has read it (unparked).
  std::vector<Event> parked, unparked;
  std::vector<bool> parked_recorded, unparked_recorded;
  // Streamed updates: per ring slot, kernel done (upload stream) and buffer free (download stream); per unit,
  // its last update written back; (start, written back) per unit for busy time, read by the engine thread.
  std::vector<Event> ring_up_done, ring_down_done;
  std::vector<bool> ring_down_recorded;
  std::vector<std::shared_ptr<Event>> unit_done;
  std::mutex update_mu;
  std::vector<std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>> t_update;
  // Timing pairs per resource.
  std::vector<std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>> t_compute, t_h2d, t_d2h;
  std::shared_ptr<Event> compute_start;

  Cuda(c10::Device device, int slots)
      : compute(c10::cuda::getCurrentCUDAStream(device.index())),
        h2d(c10::cuda::getStreamFromPool(false, device.index())),
        d2h(c10::cuda::getStreamFromPool(false, device.index())),
        up(c10::cuda::getStreamFromPool(false, device.index())),
        down(c10::cuda::getStreamFromPool(false, device.index())),
        released_recorded(slots, false) {
    for (int i = 0; i < slots; ++i) {
      loaded.emplace_back();
      released.emplace_back();
    }
  }
  void GrowParked(int64_t index) {
    while (static_cast<int64_t>(parked.size()) <= index) {
      parked.emplace_back();
      unparked.emplace_back();
      parked_recorded.push_back(false);
      unparked_recorded.push_back(false);
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

DeviceQueue::DeviceQueue(c10::Device device, int num_slots) : device_(device) {
#if SLIDE_HAVE_CUDA
  if (device.is_cuda()) cuda_ = std::make_unique<Cuda>(device, num_slots);
#else
  TORCH_CHECK(!device.is_cuda(), "this build has no CUDA support");
#endif
}

DeviceQueue::~DeviceQueue() {
  try {
    SyncStreamedUpdates();  // the downloads write into host memory about to be unregistered
  } catch (...) {           // a failed device: destructors must not throw
  }
#if SLIDE_HAVE_CUDA
  for (void* p : registered_) (void)cudaHostUnregister(p);
#endif
}

at::Tensor DeviceQueue::AllocateHost(int64_t numel, c10::ScalarType dtype) {
  // Whole, aligned pages: two buffers never share a page, which cudaHostRegister would refuse as registered twice.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  const size_t rounded = (bytes + page - 1) / page * page;
  void* p = rounded > 0 ? std::aligned_alloc(page, rounded) : nullptr;
  TORCH_CHECK(rounded == 0 || p != nullptr, "out of host memory allocating ", rounded, " bytes");
  at::Tensor t = p != nullptr ? at::from_blob(
                                    p, {numel}, [](void* q) { std::free(q); }, at::TensorOptions().dtype(dtype))
                              : at::empty({numel}, at::TensorOptions().dtype(dtype));
#if SLIDE_HAVE_CUDA
  if (cuda_ && t.nbytes() > 0) {
    C10_CUDA_CHECK(cudaHostRegister(t.data_ptr(), t.nbytes(), cudaHostRegisterDefault));
    registered_.push_back(t.data_ptr());
    pinned_bytes_ += static_cast<int64_t>(t.nbytes());
  }
#endif
  return t;
}

void DeviceQueue::EnableStreamedUpdates(int64_t chunk, int ring, size_t num_units, SimdLevel simd) {
  TORCH_CHECK(ring_state_.empty(), "streamed updates are already enabled");
  TORCH_CHECK(chunk > 0 && ring >= 2, "streamed updates need a chunk and at least two ring slots");
  chunk_ = chunk;
  simd_ = simd;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  for (int r = 0; r < ring; ++r) {
    ring_state_.push_back(at::empty({3 * chunk}, f32));                 // master | exp_avg | exp_avg_sq
    ring_grad_.push_back(at::empty({chunk}, f32));                      // fp32, or bf16 in its first half
    ring_out_.push_back(at::zeros({chunk}, f32.dtype(at::kBFloat16)));  // never stale bits in the padding it returns
  }
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    auto& c = *cuda_;
    c.ring_up_done.resize(ring);
    c.ring_down_done.resize(ring);
    c.ring_down_recorded.assign(ring, false);
    c.unit_done.assign(num_units, nullptr);
  }
#else
  (void)num_units;
#endif
}

// AdamW on ring slot `slot`, which holds elements [begin, begin + len) of the unit: each parameter range that
// meets the chunk with its own arguments (on the CPU over the same elements as the host update, so the result is
// the same bit for bit; on CUDA the kernel is bit-equal to it).
void DeviceQueue::RunRanges(int slot, int64_t begin, int64_t len, const HostUnitUpdate& u) {
  const at::Tensor& state = ring_state_[slot];
  const at::Tensor grad = u.grad.scalar_type() == at::kBFloat16
                              ? ring_grad_[slot].view(at::kBFloat16).narrow(0, 0, chunk_)
                              : ring_grad_[slot];
  for (const auto& r : u.ranges) {
    const int64_t lo = std::max(begin, r.offset), hi = std::min(begin + len, r.offset + r.numel);
    if (lo >= hi) continue;
    const int64_t off = lo - begin, k = hi - lo;
    TensorAdamW(state.narrow(0, off, k), state.narrow(0, chunk_ + off, k), state.narrow(0, 2 * chunk_ + off, k),
                grad.narrow(0, off, k), u.out.defined() ? ring_out_[slot].narrow(0, off, k) : at::Tensor(), r.args,
                simd_);
  }
}

void DeviceQueue::StreamUpdate(size_t unit, const HostUnitUpdate& u) {
  const int ring = static_cast<int>(ring_state_.size());
  TORCH_CHECK(ring > 0, "streamed updates are not enabled");
  const int64_t n = u.master.numel();
  const int64_t ge = static_cast<int64_t>(u.grad.element_size());
  auto at_f32 = [](const at::Tensor& t, int64_t i) { return t.data_ptr<float>() + i; };
  auto at_byte = [](const at::Tensor& t, int64_t i) {
    return static_cast<char*>(t.data_ptr()) + i * static_cast<int64_t>(t.element_size());
  };
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    auto& c = *cuda_;
    const c10::cuda::CUDAGuard guard(device_);
    auto start = Cuda::Mark(c.up);
    // Everything enqueued for the unit, uploads and kernels included, lies behind the event later loads wait for,
    // also when an error stops the chunks half way (the error then fails the job at the next check).
    auto finish = [&] {
      Cuda::Mark(c.up)->block(c.down);
      auto done = Cuda::Mark(c.down);
      c.unit_done[unit] = done;
      return done;
    };
    try {
      for (int64_t b = 0; b < n; b += chunk_) {
        const int64_t len = std::min(chunk_, n - b);
        const int r = static_cast<int>(next_ring_slot_++ % ring);
        if (c.ring_down_recorded[r]) c.ring_down_done[r].block(c.up);  // the slot's last results are back
        float* state = ring_state_[r].data_ptr<float>();
        auto copy = [](void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind, const c10::cuda::CUDAStream& s) {
          C10_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, s.stream()));
        };
        copy(state, at_f32(u.master, b), len * 4, cudaMemcpyHostToDevice, c.up);
        copy(state + chunk_, at_f32(u.exp_avg, b), len * 4, cudaMemcpyHostToDevice, c.up);
        copy(state + 2 * chunk_, at_f32(u.exp_avg_sq, b), len * 4, cudaMemcpyHostToDevice, c.up);
        copy(ring_grad_[r].data_ptr(), at_byte(u.grad, b), len * ge, cudaMemcpyHostToDevice, c.up);
        {
          const c10::cuda::CUDAStreamGuard on_up(c.up);
          RunRanges(r, b, len, u);
        }
        c.ring_up_done[r].record(c.up);
        c.ring_up_done[r].block(c.down);
        copy(at_f32(u.master, b), state, len * 4, cudaMemcpyDeviceToHost, c.down);
        copy(at_f32(u.exp_avg, b), state + chunk_, len * 4, cudaMemcpyDeviceToHost, c.down);
        copy(at_f32(u.exp_avg_sq, b), state + 2 * chunk_, len * 4, cudaMemcpyDeviceToHost, c.down);
        if (u.out.defined()) copy(at_byte(u.out, b), ring_out_[r].data_ptr(), len * 2, cudaMemcpyDeviceToHost, c.down);
        c.ring_down_done[r].record(c.down);
        c.ring_down_recorded[r] = true;
      }
    } catch (...) {
      try {
        finish();
      } catch (...) {  // the device itself failed: nothing more can be ordered
      }
      throw;
    }
    auto done = finish();
    std::lock_guard<std::mutex> lock(c.update_mu);
    c.t_update.emplace_back(std::move(start), std::move(done));
    return;
  }
#endif
  (void)unit;
  const double t0 = TraceNow();
  for (int64_t b = 0; b < n; b += chunk_) {
    const int64_t len = std::min(chunk_, n - b);
    const int r = static_cast<int>(next_ring_slot_++ % ring);
    at::Tensor& state = ring_state_[r];
    auto grad = u.grad.scalar_type() == at::kBFloat16 ? ring_grad_[r].view(at::kBFloat16) : ring_grad_[r];
    state.narrow(0, 0, len).copy_(u.master.narrow(0, b, len));
    state.narrow(0, chunk_, len).copy_(u.exp_avg.narrow(0, b, len));
    state.narrow(0, 2 * chunk_, len).copy_(u.exp_avg_sq.narrow(0, b, len));
    grad.narrow(0, 0, len).copy_(u.grad.narrow(0, b, len));
    RunRanges(r, b, len, u);
    u.master.narrow(0, b, len).copy_(state.narrow(0, 0, len));
    u.exp_avg.narrow(0, b, len).copy_(state.narrow(0, chunk_, len));
    u.exp_avg_sq.narrow(0, b, len).copy_(state.narrow(0, 2 * chunk_, len));
    if (u.out.defined()) u.out.narrow(0, b, len).copy_(ring_out_[r].narrow(0, 0, len));
  }
  std::lock_guard<std::mutex> lock(cpu_update_mu_);
  cpu_busy_.device_update += TraceNow() - t0;
}

void DeviceQueue::SyncStreamedUpdates() {
#if SLIDE_HAVE_CUDA
  if (cuda_ && !ring_state_.empty()) {
    cuda_->up.synchronize();
    cuda_->down.synchronize();
  }
#endif
}

std::function<void()> DeviceQueue::LoadSlot(int slot, at::Tensor dst, const at::Tensor& src, int64_t after_update) {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    auto& c = *cuda_;
    if (c.released_recorded[slot]) c.released[slot].block(c.h2d);
    if (after_update >= 0 && static_cast<size_t>(after_update) < c.unit_done.size() && c.unit_done[after_update])
      c.unit_done[after_update]->block(c.h2d);
    c10::cuda::CUDAStreamGuard guard(c.h2d);
    auto t0 = Cuda::Mark(c.h2d);
    dst.copy_(src, /*non_blocking=*/true);
    auto copied = Cuda::Mark(c.h2d);
    c.t_h2d.emplace_back(t0, copied);
    c.loaded[slot].record(c.h2d);
    return [copied] { copied->synchronize(); };
  }
#endif
  const double t0 = TraceNow();
  dst.copy_(src);
  cpu_busy_.h2d += TraceNow() - t0;
  cpu_spans_.push_back({"gpu.h2d", "h2d", t0, TraceNow()});
  return [] {};
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

void DeviceQueue::Park(int64_t index, at::Tensor dst, const at::Tensor& src) {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    auto& c = *cuda_;
    c.GrowParked(index);
    if (c.unparked_recorded[index]) c.unparked[index].block(c.d2h);  // the previous micro-batch's copy back
    Offload(std::move(dst), src);
    c.parked[index].record(c.d2h);
    c.parked_recorded[index] = true;
    return;
  }
#endif
  Offload(std::move(dst), src);
}

void DeviceQueue::Unpark(int64_t index, int slot, at::Tensor dst, const at::Tensor& src) {
#if SLIDE_HAVE_CUDA
  if (cuda_) {
    auto& c = *cuda_;
    c.GrowParked(index);
    if (c.parked_recorded[index]) c.parked[index].block(c.h2d);
    LoadSlot(slot, std::move(dst), src);
    c.unparked[index].record(c.h2d);
    c.unparked_recorded[index] = true;
    return;
  }
#endif
  LoadSlot(slot, std::move(dst), src);
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
    // The compute and copy streams, not the update streams: streamed updates run on into the next step.
    cuda_->compute.synchronize();
    cuda_->h2d.synchronize();
    cuda_->d2h.synchronize();
    // Every event of those streams has completed; one recorded now completes at once, which pins the device clock to
    // the host's.
    Cuda::Event end(cudaEventDefault);
    end.record(cuda_->compute);
    end.synchronize();
    const double end_host = TraceNow();
    QueueBusy b;
    b.compute = Cuda::Sum(cuda_->t_compute, "gpu.compute", spans, &end, end_host);
    b.h2d = Cuda::Sum(cuda_->t_h2d, "gpu.h2d", spans, &end, end_host);
    b.d2h = Cuda::Sum(cuda_->t_d2h, "gpu.d2h", spans, &end, end_host);
    std::vector<std::pair<std::shared_ptr<Cuda::Event>, std::shared_ptr<Cuda::Event>>> finished;
    {
      std::lock_guard<std::mutex> lock(cuda_->update_mu);
      auto& pending = cuda_->t_update;
      auto still =
          std::stable_partition(pending.begin(), pending.end(), [](const auto& p) { return !p.second->query(); });
      finished.assign(std::make_move_iterator(still), std::make_move_iterator(pending.end()));
      pending.erase(still, pending.end());
    }
    b.device_update = Cuda::Sum(finished, "gpu.update", spans, &end, end_host);
    return b;
  }
#endif
  if (spans != nullptr) spans->insert(spans->end(), cpu_spans_.begin(), cpu_spans_.end());
  cpu_spans_.clear();
  std::lock_guard<std::mutex> lock(cpu_update_mu_);
  return std::exchange(cpu_busy_, QueueBusy{});
}

}  // namespace slide
