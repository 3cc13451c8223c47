// UpdateScheduler: when and where each unit's optimizer update runs, and where the next forward finds its weights.
//   gradients  a returned gradient lands in host memory (DeviceQueue::Offload) and its update is posted to an
//              update worker: as it lands (no clipping), or once the global norm is in (exact clipping, PostUpdates);
//              under accumulation the worker sums the micro-batches' gradients in fp32 first.
//   where      resident units update on the device (AdamW kernel, compute stream); streamed units, in whole-update
//              steps, through the device's copy engines (their own worker enqueues them); the others on the CPU,
//              with the NVMe tier reading their state ahead chunk by chunk.
//   weights    under clipping a step may go weights first (WeightsFirst): a weights-only pass per host layer, in
//   first      forward order, writes the next weights into a ring the next forward loads from; the whole updates
//              follow in reverse order. Automatic by measured step times (WeightsFirstPolicy).
//   loads      the next load of a unit waits for the task that writes its weights, and nothing else.
// Tasks are named by an UpdateKey {unit, pass, chunk}; one function maps a key to the worker's task id. A task's
// exception is kept by its worker and becomes the scheduler's sticky error (the state is no longer trustworthy).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/optim/cpu_adamw.h"
#include "engine/runtime/sliding_options.h"
#include "engine/runtime/update_worker.h"
#include "engine/runtime/weight_ring.h"
#include "engine/runtime/weights_first_policy.h"

namespace slide {

class DeviceQueue;
class StepMeter;
class UnitStore;

// An update task: a unit's whole update, or its weights-only pass (weights first). The embedding's and the head's
// weights-only passes go in chunks of a ring buffer, chunk >= 0; a layer's is one task, chunk -1.
enum class Pass { kWhole, kWeightsOnly };
struct UpdateKey {
  size_t unit = 0;
  Pass pass = Pass::kWhole;
  int64_t chunk = -1;
};

class UpdateScheduler {
 public:
  // `options` is the trainer's (its weights-first mode may change between steps: set_weights_first).
  UpdateScheduler(UnitStore& units, DeviceQueue& queue, StepMeter& meter, const SlidingOptions& options,
                  SimdLevel simd);
  ~UpdateScheduler();  // waits for every posted task

  // A step's start, before its first gradient lands: the accumulation factor, and whether the updates it posts go
  // weights first (a streamed unit's gradient goes to the worker that will update it). Returns that choice.
  bool BeginStep(int64_t micro_batches);
  // A gradient computed on the device: held there for a resident unit, else copied to host memory (and summed).
  void LandGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last);
  // The global gradient norm's square over every unit, once the last micro-batch's gradients have landed.
  double GlobalSqNorm();
  // `unit`'s whole update as step `step` (1-based) with the rate and the clipping coefficient.
  void PostUpdate(size_t unit, double lr, float grad_scale, int64_t step);
  // Every unit's update after the global norm (clipping), weights first when BeginStep chose it. Returns whether
  // this step's updates went weights first.
  bool PostUpdates(double lr, float grad_scale, int64_t step);
  // The step's end: its times for the automatic weights-first choice.
  void EndStep(double step_s, double compute_s, double cpu_update_s, double whole_adamw_s);
  // An evaluation or a checkpoint ran between steps: the next step's time is not its schedule's.
  void ForgetPostedUpdates() { updates_posted_ = false; }

  // Loads, on the engine thread. Whether the task writing the layer's next weights has finished (never waits):
  bool LoadReady(int64_t layer) const;
  // Waits for that task, then issues `copy` from where the weights are: the weights-first ring (its buffer is reused
  // once the returned function says the copy has read it) or the staging buffer (`after_update` >= 0: a streamed
  // unit whose write-back the copy must wait for).
  using LayerCopy = std::function<std::function<void()>(const at::Tensor& src, int64_t after_update)>;
  void LoadLayer(int64_t layer, const LayerCopy& copy);
  // The embedding or the head: from the ring chunk by chunk, each copy issued as its pass ends, or whole from
  // staging once its update is done. `copy` gets the destination range [begin, begin + n) and the source.
  using EdgeCopy = std::function<std::function<void()>(int64_t begin, int64_t n, const at::Tensor& src)>;
  void LoadEdge(bool head, const EdgeCopy& copy);

  void WaitAll();  // every posted task has finished
  // The first failed task's error (sticky: the state is no longer trustworthy): a task's status (an NVMe read or
  // write-back), or an exception its worker caught, as INTERNAL. Never waits.
  Status status();
  Status Sync();                  // WaitAll, streamed write-backs landed, the tier flushed; the first error
  void CancelWeightRing();        // no forward will read what waits in the ring: fills go on, loads use staging
  bool schedule_settled() const;  // fixed by the options, or the automatic choice has measured what it needs
  void set_weights_first(WeightsFirst mode);
  int64_t ring_loads() const { return ring_loads_; }
  int64_t edge_ring_chunks() const { return edge_ring_chunks_; }

 private:
  size_t TaskId(const UpdateKey& key) const;
  UpdateWorker& WorkerFor(const UpdateKey& key) const;  // holding the key's latest task
  UpdateWorker& PostWorker(size_t unit);                // a unit's new whole-update task goes to (and then holds)
  static std::string Name(const UpdateKey& key);        // in traces: "5", "weights 5", "weights 0.1"
  // Waits for every task posted under `key`; the trace names the wait `why` and the key.
  void Wait(const UpdateKey& key, const char* why);
  bool Streamed(size_t unit) const;  // updated through the device in this step
  bool WeightsFirstEligible(size_t unit) const;
  bool EdgeWeightsFirstEligible(size_t unit) const;
  int64_t EdgeChunks(size_t unit) const;
  struct Range {
    int64_t begin, n;
  };
  Range EdgeChunk(size_t unit, int64_t chunk) const;
  bool ChooseWeightsFirst();
  bool PolicyChooses() const;
  void LandResidentGrad(size_t unit, const at::Tensor& device_grad, bool first, bool last);
  void UpdateResident(size_t unit, const AdamWStepArgs& args);
  void PostWeightsOnly(size_t unit, int64_t chunk, const AdamWStepArgs& args, int64_t ticket);
  AdamWStepArgs StepArgs(double lr, float grad_scale, int64_t step) const;
  void TakeWorkerErrors();
  void Fail(Status error);  // any thread: keeps the first error

  UnitStore& units_;
  DeviceQueue& queue_;
  StepMeter& meter_;
  const SlidingOptions& options_;
  const SimdLevel simd_;
  const size_t n_units_;
  int64_t accum_ = 1;
  std::unique_ptr<UpdateWorker> worker_;
  // Streamed units' tasks: a thread that waits for their gradients and enqueues them (never behind CPU updates).
  std::unique_ptr<UpdateWorker> stream_worker_;
  std::vector<bool> on_stream_worker_;     // by unit: its latest whole-update task went to stream_worker_
  std::vector<at::Tensor> device_sqnorm_;  // squared norms computed on the device (no accumulation)
  std::mutex error_mu_;
  Status error_;  // the first failed task
  // Weights first: the ring (made here when a step may go weights first), each layer's ticket while its next
  // weights wait there (-1: load from staging), the embedding's and the head's first chunk's ticket.
  std::unique_ptr<WeightRing> ring_;
  int64_t edge_chunks_max_ = 0;  // chunks of the larger edge unit (task ids reserved for each edge)
  std::vector<int64_t> layer_ticket_;
  int64_t edge_ticket_[2] = {-1, -1};
  int64_t ring_loads_ = 0, edge_ring_chunks_ = 0;
  WeightsFirst weights_first_mode_;
  WeightsFirstPolicy policy_;
  bool weights_first_step_ = false;  // this step's updates go weights first
  // The last step posted updates after its norm and the next step runs them as posted (no evaluation or wait
  // between): the policy counts only such steps.
  bool updates_posted_ = false;
  bool ran_updates_ = false, ran_weights_first_ = false;  // of the step running now
  bool last_posted_weights_first_ = false;
};

}  // namespace slide
