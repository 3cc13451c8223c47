// The device is the CPU (tests, CI, the demo): every copy and update runs at once on the calling thread; busy
// times and trace spans are wall clock.
#include <ATen/ATen.h>

#include <mutex>
#include <optional>
#include <utility>

#include "engine/runtime/device_queue.h"

namespace slide {
namespace {

class HostDeviceQueue final : public DeviceQueue {
 public:
  HostDeviceQueue() : DeviceQueue(/*page_lock=*/false) {}

  std::function<void()> LoadSlot(int, at::Tensor dst, const at::Tensor& src, int64_t) override {
    Copy(dst, src, "gpu.h2d", "h2d", busy_.h2d);
    return [] {};
  }
  std::function<void()> LoadSlotNf4(int, at::Tensor dst, const UnitLayout& layout, const Nf4Unit& src) override {
    const double t0 = TraceNow();
    DequantizeNf4Unit(layout, src, dst);
    const double t1 = TraceNow();
    busy_.h2d += t1 - t0;
    spans_.push_back({"gpu.h2d", "h2d nf4", t0, t1});
    return [] {};
  }
  void UseSlot(int) override {}
  void ReleaseSlot(int) override {}
  std::function<void()> Offload(at::Tensor dst, const at::Tensor& src) override {
    Copy(dst, src, "gpu.d2h", "d2h", busy_.d2h);
    return [] {};
  }
  void Park(int64_t, at::Tensor dst, const at::Tensor& src) override { Offload(std::move(dst), src); }
  void Unpark(int64_t, int slot, at::Tensor dst, const at::Tensor& src) override {
    LoadSlot(slot, std::move(dst), src, -1);
  }

  void EnableStreamedUpdates(int64_t chunk, int ring, size_t, SimdLevel simd) override {
    TORCH_CHECK(!ring_, "streamed updates are already enabled");
    ring_.emplace(c10::Device(c10::kCPU), chunk, ring, simd);
  }
  // The same chunks through the same ring as on a device, so the result is the CUDA path's bit for bit.
  void StreamUpdate(size_t, const HostUnitUpdate& u) override {
    TORCH_CHECK(ring_, "streamed updates are not enabled");
    const double t0 = TraceNow();
    const at::Tensor host_m = u.exp_avg.view(at::kByte), host_v = u.exp_avg_sq.view(at::kByte);
    for (const StreamChunk& c : PlanStreamChunks(u, ring_->chunk())) {
      const int r = ring_->NextSlot();
      const at::Tensor slot_m = ring_->moment_bytes(r, 0), slot_v = ring_->moment_bytes(r, 1);
      ring_->master(r).narrow(0, 0, c.len).copy_(u.master.narrow(0, c.begin, c.len));
      for (const auto& piece : c.moment_bytes) {
        slot_m.narrow(0, piece.slot, piece.size).copy_(host_m.narrow(0, piece.host, piece.size));
        slot_v.narrow(0, piece.slot, piece.size).copy_(host_v.narrow(0, piece.host, piece.size));
      }
      ring_->grad(r, u.grad.scalar_type()).narrow(0, 0, c.len).copy_(u.grad.narrow(0, c.begin, c.len));
      ring_->Run(r, c, u);
      u.master.narrow(0, c.begin, c.len).copy_(ring_->master(r).narrow(0, 0, c.len));
      for (const auto& piece : c.moment_bytes) {
        host_m.narrow(0, piece.host, piece.size).copy_(slot_m.narrow(0, piece.slot, piece.size));
        host_v.narrow(0, piece.host, piece.size).copy_(slot_v.narrow(0, piece.slot, piece.size));
      }
      if (u.out.defined()) u.out.narrow(0, c.begin, c.len).copy_(ring_->out(r).narrow(0, 0, c.len));
    }
    std::lock_guard<std::mutex> lock(update_mu_);
    busy_.device_update += TraceNow() - t0;
  }
  void SyncStreamedUpdates() override {}

  void BeginCompute() override { compute_t0_ = TraceNow(); }
  void EndCompute() override {
    const double t1 = TraceNow();
    busy_.compute += t1 - compute_t0_;
    spans_.push_back({"gpu.compute", "compute", compute_t0_, t1});
  }

  QueueBusy TakeBusy(std::vector<TraceSpan>* spans) override {
    if (spans != nullptr) spans->insert(spans->end(), spans_.begin(), spans_.end());
    spans_.clear();
    std::lock_guard<std::mutex> lock(update_mu_);
    return std::exchange(busy_, QueueBusy{});
  }

 private:
  void Copy(at::Tensor& dst, const at::Tensor& src, const char* lane, const char* name, double& busy) {
    const double t0 = TraceNow();
    dst.copy_(src);
    const double t1 = TraceNow();
    busy += t1 - t0;
    spans_.push_back({lane, name, t0, t1});
  }

  std::optional<AdamWRing> ring_;
  QueueBusy busy_;
  std::mutex update_mu_;          // busy_.device_update is added from the thread that streams updates
  std::vector<TraceSpan> spans_;  // the engine thread's segments, for TakeBusy
  double compute_t0_ = 0;
};

}  // namespace

std::unique_ptr<DeviceQueue> MakeHostDeviceQueue() { return std::make_unique<HostDeviceQueue>(); }

}  // namespace slide
