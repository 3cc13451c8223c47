#include "engine/runtime/step_meter.h"

#include <algorithm>
#include <utility>

#include "engine/runtime/device_info.h"
#include "engine/runtime/device_queue.h"

namespace slide {

int64_t PhaseMemory::Max() const { return std::max({step_start, forward, head, layers, embedding, update}); }

void PhaseMemory::Include(const PhaseMemory& other) {
  for (auto [mine, theirs] : {std::pair{&step_start, other.step_start},
                              {&forward, other.forward},
                              {&head, other.head},
                              {&layers, other.layers},
                              {&embedding, other.embedding},
                              {&update, other.update}})
    *mine = std::max(*mine, theirs);
}

double ResourceBusy::MaxResource() const { return std::max({compute, h2d, d2h, cpu_update, nvme, device_update}); }

double ResourceBusy::OverlapRatio() const { return MaxResource() > 0 ? step / MaxResource() : 0; }

const char* ResourceBusy::Bound() const {
  if (wait_update > 0.2 * step) return nvme > cpu_update ? "nvme" : "update_dependency";
  const char* name = "gpu_compute";
  double most = compute;
  if (h2d > most) name = "h2d", most = h2d;
  if (d2h > most) name = "d2h", most = d2h;
  if (cpu_update > most) name = "cpu_update", most = cpu_update;
  if (nvme > most) name = "nvme", most = nvme;
  if (device_update > most) name = "device_update";
  return name;
}

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void StepMeter::AddSpan(const char* lane, std::string name, double t0, double t1) {
  if (!trace_on_) return;
  std::lock_guard<std::mutex> lock(trace_mu_);
  pending_trace_.push_back({lane, std::move(name), t0, t1});
}

void StepMeter::AddUpdateSpan(const std::string& name, int64_t took_ns) {
  if (!trace_on_) return;
  const double now = TraceNow();
  AddSpan("update", name, now - took_ns / 1e9, now);
}

void StepMeter::Begin() {
  busy_ = ResourceBusy{};
  update_ns_at_begin_ = update_ns_.load();
  whole_adamw_ns_at_begin_ = whole_adamw_ns_.load();
  weights_only_ns_at_begin_ = weights_only_ns_.load();
  nvme_ns_at_begin_ = nvme_wait_ns_.load();
}

double StepMeter::WholeAdamWSeconds() const { return (whole_adamw_ns_.load() - whole_adamw_ns_at_begin_) / 1e9; }

void StepMeter::Finish(const QueueBusy& q, std::vector<TraceSpan> device_spans) {
  if (trace_on_) {
    std::lock_guard<std::mutex> lock(trace_mu_);
    trace_ = std::move(pending_trace_);
    pending_trace_.clear();
    trace_.insert(trace_.end(), device_spans.begin(), device_spans.end());
  }
  busy_.compute = q.compute;
  busy_.h2d = q.h2d;
  busy_.d2h = q.d2h;
  busy_.cpu_update = (update_ns_.load() - update_ns_at_begin_) / 1e9;
  busy_.cpu_update_weights = (weights_only_ns_.load() - weights_only_ns_at_begin_) / 1e9;
  busy_.nvme = (nvme_wait_ns_.load() - nvme_ns_at_begin_) / 1e9;
  busy_.device_update = q.device_update;
}

PhasePeakProbe::PhasePeakProbe(bool on, PhaseMemory& memory) : on_(on) {
  memory = PhaseMemory{};
  if (on_) memory.step_start = ReadDeviceAllocatorStats().allocated_bytes;
}

void PhasePeakProbe::Begin() const {
  if (on_) RestartDevicePeak();
}

void PhasePeakProbe::End(int64_t& peak) const {
  if (on_) peak = std::max(peak, ReadDeviceAllocatorStats().peak_allocated_bytes);
}

}  // namespace slide
