// StepMeter: what one training step cost and where its time went. Busy seconds per resource (ResourceBusy), the
// update tasks' CPU time counted from their worker threads, each phase's peak device memory (PhaseMemory), and the
// step's timeline (trace spans). The trainer opens a step (Begin), the update scheduler and the engine thread add
// to it, and the trainer closes it with the device queue's busy times (Finish).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/runtime/step_trace.h"

namespace slide {

struct QueueBusy;  // device_queue.h

// The caching allocator's peak allocated bytes in each phase of the last step (SlidingOptions::
// measure_phase_memory), absolute: what the memory plan's device total less its reserve estimates at that phase.
struct PhaseMemory {
  int64_t step_start = 0;  // allocated as the step began: weights, slots, resident state, the trainer's buffers
  int64_t forward = 0;     // the layers' forward without autograd (layer inputs kept)
  int64_t head = 0;        // the LM head's loss and gradients
  int64_t layers = 0;      // the largest of the layers' recompute + backward
  int64_t embedding = 0;   // the embedding's backward
  int64_t update = 0;      // from the embedding's gradient to the step's end: the norm, the device updates
  int64_t Max() const;
  void Include(const PhaseMemory& other);  // each phase the larger of the two (peaks over several steps)
};

// Seconds each resource was busy in the last step: device compute / H2D / D2H from CUDA events (wall clock
// when the device is the CPU), CPU update time measured inside the update tasks.
struct ResourceBusy {
  double compute = 0;
  double h2d = 0;
  double d2h = 0;
  double cpu_update = 0;          // gradient accumulation, host norms and AdamW (posted in this step)
  double cpu_update_weights = 0;  // of cpu_update: weights-only passes (WeightsFirst)
  double nvme = 0;                // update tasks waiting on the NVMe tier (reads not in yet, write-backs pending)
  double device_update = 0;       // streamed updates that finished in this step (upload to download, per unit)
  double wait_update = 0;         // engine thread blocked on a unit's update before loading it
  double step = 0;                // wall time of Step()
  bool weights_first = false;     // this step's updates went weights first (the next forward loads from the ring)
  double MaxResource() const;
  // step / the busiest resource: 1.0 when the step costs exactly its busiest resource (everything else hidden
  // behind it); above 1 by the time nothing overlapped.
  double OverlapRatio() const;
  // What bounds the step: the busiest resource, or "update_dependency" when the engine waited on updates for
  // more than a fifth of the step (exact clipping puts every update after the backward's norm, so the next
  // forward waits for them whatever the resource totals say), or "nvme" when those updates mostly waited on
  // the disk.
  const char* Bound() const;
};

// Adds the seconds since its construction to `sink` when it goes out of scope.
class ScopedTimer {
 public:
  explicit ScopedTimer(double& sink) : sink_(sink), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { sink_ += Elapsed(); }
  double Elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  double& sink_;
  std::chrono::steady_clock::time_point t0_;
};

int64_t SteadyNowNs();

class StepMeter {
 public:
  explicit StepMeter(bool trace) : trace_on_(trace) {}

  // Update tasks, from any thread: their CPU time by kind (the disk's waits apart, as nvme).
  void AddWholeUpdate(int64_t ns) {  // a unit's whole AdamW update
    update_ns_ += ns;
    whole_adamw_ns_ += ns;
  }
  void AddWeightsOnly(int64_t ns) {  // a weights-only pass
    update_ns_ += ns;
    weights_only_ns_ += ns;
  }
  void AddAccumulation(int64_t ns) { update_ns_ += ns; }  // gradient sums and their norms
  void AddNvmeWait(int64_t ns) { nvme_wait_ns_ += ns; }

  // Trace spans, from any thread; nothing is kept unless tracing.
  bool tracing() const { return trace_on_; }
  void AddSpan(const char* lane, std::string name, double t0, double t1);
  void AddUpdateSpan(const std::string& name, int64_t took_ns);  // lane "update", ending now

  // A step: Begin clears the busy times and notes the counters; the engine thread adds its waits to busy().
  // Finish takes the device queue's busy times and spans, the counters' growth since Begin, and makes the spans
  // since the last Finish the step's trace.
  void Begin();
  ResourceBusy& busy() { return busy_; }
  const ResourceBusy& busy() const { return busy_; }
  void Finish(const QueueBusy& queue, std::vector<TraceSpan> device_spans);
  double WholeAdamWSeconds() const;  // of the CPU update since Begin, whole AdamW updates alone

  PhaseMemory& phase_memory() { return phase_memory_; }
  const PhaseMemory& phase_memory() const { return phase_memory_; }
  const std::vector<TraceSpan>& trace() const { return trace_; }

 private:
  const bool trace_on_;
  std::atomic<int64_t> update_ns_{0};
  std::atomic<int64_t> whole_adamw_ns_{0};  // of update_ns_: whole AdamW updates alone (no accumulation, no passes)
  std::atomic<int64_t> weights_only_ns_{0};
  std::atomic<int64_t> nvme_wait_ns_{0};
  int64_t update_ns_at_begin_ = 0, whole_adamw_ns_at_begin_ = 0, weights_only_ns_at_begin_ = 0, nvme_ns_at_begin_ = 0;
  ResourceBusy busy_;
  PhaseMemory phase_memory_;
  std::mutex trace_mu_;
  std::vector<TraceSpan> trace_;          // the last step's timeline
  std::vector<TraceSpan> pending_trace_;  // spans since then; update tasks append from their worker threads
};

// Peaks one phase at a time into `memory` (cleared, with what the step starts with): Begin restarts the allocator's
// peak, End folds the phase's peak into `peak` (max over micro-batches and layers). Off: does nothing.
class PhasePeakProbe {
 public:
  PhasePeakProbe(bool on, PhaseMemory& memory);
  void Begin() const;
  void End(int64_t& peak) const;

 private:
  bool on_;
};

}  // namespace slide
