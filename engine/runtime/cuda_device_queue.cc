// The CUDA device: compute on the current stream, loads on an H2D stream, gradient and parked-input copies on a D2H
// stream, streamed updates on an upload and a download stream; events order them (device_queue.h) and time them.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "engine/runtime/device_queue.h"

namespace slide {
namespace {

using Event = c10::cuda::CUDAEvent;
using Stream = c10::cuda::CUDAStream;
using Segments = std::vector<std::pair<std::shared_ptr<Event>, std::shared_ptr<Event>>>;

std::shared_ptr<Event> Mark(const Stream& s) {
  auto e = std::make_shared<Event>(cudaEventDefault);
  e->record(s);
  return e;
}

// Seconds in the segments; with `spans`, each segment on the host clock: `end` completed at `end_host`.
double Sum(Segments& v, const char* lane, std::vector<TraceSpan>* spans, Event* end, double end_host) {
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

void CopyAsync(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind, const Stream& s) {
  C10_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, s.stream()));
}

class CudaDeviceQueue final : public DeviceQueue {
 public:
  CudaDeviceQueue(c10::Device device, int slots)
      : DeviceQueue(/*page_lock=*/true),
        device_(device),
        compute_(c10::cuda::getCurrentCUDAStream(device.index())),
        h2d_(c10::cuda::getStreamFromPool(false, device.index())),
        d2h_(c10::cuda::getStreamFromPool(false, device.index())),
        up_(c10::cuda::getStreamFromPool(false, device.index())),
        down_(c10::cuda::getStreamFromPool(false, device.index())),
        loaded_(slots),
        released_(slots),
        released_recorded_(slots, false) {}

  ~CudaDeviceQueue() override {
    try {
      SyncStreamedUpdates();  // the downloads write into host memory about to be freed
    } catch (...) {           // a failed device: destructors must not throw
    }
  }

  std::function<void()> LoadSlot(int slot, at::Tensor dst, const at::Tensor& src, int64_t after_update) override {
    if (released_recorded_[slot]) released_[slot].block(h2d_);
    if (after_update >= 0 && static_cast<size_t>(after_update) < unit_done_.size() && unit_done_[after_update])
      unit_done_[after_update]->block(h2d_);
    c10::cuda::CUDAStreamGuard guard(h2d_);
    auto t0 = Mark(h2d_);
    dst.copy_(src, /*non_blocking=*/true);
    auto copied = Mark(h2d_);
    t_h2d_.emplace_back(t0, copied);
    loaded_[slot].record(h2d_);
    return [copied] { copied->synchronize(); };
  }

  std::function<void()> LoadSlotNf4(int slot, at::Tensor dst, const UnitLayout& layout, const Nf4Unit& src) override {
    if (released_recorded_[slot]) released_[slot].block(h2d_);
    c10::cuda::CUDAStreamGuard guard(h2d_);
    auto t0 = Mark(h2d_);
    // One scratch for every slot: loads and their dequantisation run in order on the copy stream, so the next copy
    // into it starts after the last kernel read it.
    const std::vector<const at::Tensor*> from = src.Arrays();
    const std::vector<at::Tensor*> into = nf4_scratch_.Arrays();
    for (size_t i = 0; i < from.size(); ++i)
      if (from[i]->defined() && (!into[i]->defined() || into[i]->numel() < from[i]->numel()))
        *into[i] = at::empty({from[i]->numel()}, from[i]->options().device(device_));
    Nf4Unit on_device = Nf4UnitViews(src, nf4_scratch_);
    const std::vector<at::Tensor*> views = on_device.Arrays();
    for (size_t i = 0; i < from.size(); ++i)
      if (from[i]->defined()) views[i]->copy_(*from[i], /*non_blocking=*/true);
    auto copied = Mark(h2d_);
    DequantizeNf4Unit(layout, on_device, dst);
    auto done = Mark(h2d_);
    t_h2d_.emplace_back(t0, done);
    loaded_[slot].record(h2d_);
    return [copied] { copied->synchronize(); };
  }

  void UseSlot(int slot) override {
    if (loaded_[slot].isCreated()) loaded_[slot].block(compute_);
  }

  void ReleaseSlot(int slot) override {
    released_[slot].record(compute_);
    released_recorded_[slot] = true;
  }

  std::function<void()> Offload(at::Tensor dst, const at::Tensor& src) override {
    auto ready = Mark(compute_);
    ready->block(d2h_);
    c10::cuda::CUDAStreamGuard guard(d2h_);
    auto t0 = Mark(d2h_);
    dst.copy_(src, /*non_blocking=*/true);
    // src was made on the compute stream; keep its memory from reuse until the D2H stream is done with it.
    c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), d2h_);
    auto done = Mark(d2h_);
    t_d2h_.emplace_back(t0, done);
    return [done] { done->synchronize(); };
  }

  void Park(int64_t index, at::Tensor dst, const at::Tensor& src) override {
    GrowParked(index);
    if (unparked_recorded_[index]) unparked_[index].block(d2h_);  // the previous micro-batch's copy back
    Offload(std::move(dst), src);
    parked_[index].record(d2h_);
    parked_recorded_[index] = true;
  }

  void Unpark(int64_t index, int slot, at::Tensor dst, const at::Tensor& src) override {
    GrowParked(index);
    if (parked_recorded_[index]) parked_[index].block(h2d_);
    LoadSlot(slot, std::move(dst), src, -1);
    unparked_[index].record(h2d_);
    unparked_recorded_[index] = true;
  }

  void EnableStreamedUpdates(int64_t chunk, int ring, size_t num_units, SimdLevel simd) override {
    TORCH_CHECK(!ring_, "streamed updates are already enabled");
    ring_.emplace(device_, chunk, ring, simd);
    ring_up_done_.resize(ring);
    ring_down_done_.resize(ring);
    ring_down_recorded_.assign(ring, false);
    unit_done_.assign(num_units, nullptr);
  }

  void StreamUpdate(size_t unit, const HostUnitUpdate& u) override {
    TORCH_CHECK(ring_, "streamed updates are not enabled");
    const int64_t ge = static_cast<int64_t>(u.grad.element_size());
    auto at_f32 = [](const at::Tensor& t, int64_t i) { return t.data_ptr<float>() + i; };
    auto at_byte = [](const at::Tensor& t, int64_t i) {
      return static_cast<char*>(t.data_ptr()) + i * static_cast<int64_t>(t.element_size());
    };
    auto bytes = [](const at::Tensor& t, int64_t offset) { return static_cast<char*>(t.data_ptr()) + offset; };
    const std::vector<StreamChunk> chunks = PlanStreamChunks(u, ring_->chunk());
    const c10::cuda::CUDAGuard guard(device_);
    auto start = Mark(up_);
    // Everything enqueued for the unit, uploads and kernels included, lies behind the event later loads wait for,
    // also when an error stops the chunks half way (the error then fails the job at the next check).
    auto finish = [&] {
      Mark(up_)->block(down_);
      auto done = Mark(down_);
      unit_done_[unit] = done;
      return done;
    };
    try {
      for (const StreamChunk& c : chunks) {
        const int64_t b = c.begin, len = c.len;
        const int r = ring_->NextSlot();
        if (ring_down_recorded_[r]) ring_down_done_[r].block(up_);  // the slot's last results are back
        const at::Tensor slot_m = ring_->moment_bytes(r, 0), slot_v = ring_->moment_bytes(r, 1);
        CopyAsync(ring_->master(r).data_ptr(), at_f32(u.master, b), len * 4, cudaMemcpyHostToDevice, up_);
        for (const auto& piece : c.moment_bytes) {
          CopyAsync(bytes(slot_m, piece.slot), bytes(u.exp_avg, piece.host), piece.size, cudaMemcpyHostToDevice, up_);
          CopyAsync(bytes(slot_v, piece.slot), bytes(u.exp_avg_sq, piece.host), piece.size, cudaMemcpyHostToDevice,
                    up_);
        }
        CopyAsync(ring_->grad(r, u.grad.scalar_type()).data_ptr(), at_byte(u.grad, b), len * ge, cudaMemcpyHostToDevice,
                  up_);
        {
          const c10::cuda::CUDAStreamGuard on_up(up_);
          ring_->Run(r, c, u);
        }
        ring_up_done_[r].record(up_);
        ring_up_done_[r].block(down_);
        CopyAsync(at_f32(u.master, b), ring_->master(r).data_ptr(), len * 4, cudaMemcpyDeviceToHost, down_);
        for (const auto& piece : c.moment_bytes) {
          CopyAsync(bytes(u.exp_avg, piece.host), bytes(slot_m, piece.slot), piece.size, cudaMemcpyDeviceToHost, down_);
          CopyAsync(bytes(u.exp_avg_sq, piece.host), bytes(slot_v, piece.slot), piece.size, cudaMemcpyDeviceToHost,
                    down_);
        }
        if (u.out.defined())
          CopyAsync(at_byte(u.out, b), ring_->out(r).data_ptr(), len * 2, cudaMemcpyDeviceToHost, down_);
        ring_down_done_[r].record(down_);
        ring_down_recorded_[r] = true;
      }
    } catch (...) {
      try {
        finish();
      } catch (...) {  // the device itself failed: nothing more can be ordered
      }
      throw;
    }
    auto done = finish();
    std::lock_guard<std::mutex> lock(update_mu_);
    t_update_.emplace_back(std::move(start), std::move(done));
  }

  void SyncStreamedUpdates() override {
    if (!ring_) return;
    up_.synchronize();
    down_.synchronize();
  }

  void BeginCompute() override { compute_start_ = Mark(compute_); }
  void EndCompute() override { t_compute_.emplace_back(compute_start_, Mark(compute_)); }

  QueueBusy TakeBusy(std::vector<TraceSpan>* spans) override {
    // The compute and copy streams, not the update streams: streamed updates run on into the next step.
    compute_.synchronize();
    h2d_.synchronize();
    d2h_.synchronize();
    // Every event of those streams has completed; one recorded now completes at once, which pins the device clock
    // to the host's.
    Event end(cudaEventDefault);
    end.record(compute_);
    end.synchronize();
    const double end_host = TraceNow();
    QueueBusy b;
    b.compute = Sum(t_compute_, "gpu.compute", spans, &end, end_host);
    b.h2d = Sum(t_h2d_, "gpu.h2d", spans, &end, end_host);
    b.d2h = Sum(t_d2h_, "gpu.d2h", spans, &end, end_host);
    Segments finished;
    {
      std::lock_guard<std::mutex> lock(update_mu_);
      auto still =
          std::stable_partition(t_update_.begin(), t_update_.end(), [](const auto& p) { return !p.second->query(); });
      finished.assign(std::make_move_iterator(still), std::make_move_iterator(t_update_.end()));
      t_update_.erase(still, t_update_.end());
    }
    b.device_update = Sum(finished, "gpu.update", spans, &end, end_host);
    return b;
  }

 private:
  void GrowParked(int64_t index) {
    while (static_cast<int64_t>(parked_.size()) <= index) {
      parked_.emplace_back();
      unparked_.emplace_back();
      parked_recorded_.push_back(false);
      unparked_recorded_.push_back(false);
    }
  }

  c10::Device device_;
  Stream compute_, h2d_, d2h_;
  Stream up_, down_;  // streamed updates
  std::vector<Event> loaded_, released_;
  std::vector<bool> released_recorded_;
  // Parked layer inputs, per layer: its D2H copy landed (parked) and its H2D copy back has read it (unparked).
  std::vector<Event> parked_, unparked_;
  std::vector<bool> parked_recorded_, unparked_recorded_;
  // Streamed updates: per ring slot, kernel done (upload stream) and buffer free (download stream); per unit, its
  // last update written back; (start, written back) per unit for busy time, read by the engine thread.
  std::optional<AdamWRing> ring_;
  std::vector<Event> ring_up_done_, ring_down_done_;
  std::vector<bool> ring_down_recorded_;
  std::vector<std::shared_ptr<Event>> unit_done_;
  std::mutex update_mu_;
  Segments t_update_;
  Segments t_compute_, t_h2d_, t_d2h_;  // timing pairs per resource
  std::shared_ptr<Event> compute_start_;
  Nf4Unit nf4_scratch_;  // the device arrays NF4 loads go through (LoadSlotNf4), grown to the largest layer's
};

}  // namespace

std::unique_ptr<DeviceQueue> MakeCudaDeviceQueue(c10::Device device, int num_slots) {
  return std::make_unique<CudaDeviceQueue>(device, num_slots);
}

}  // namespace slide
