// DeviceQueue: the streams of one device and the ordering between them. On CUDA, host->device copies run on
// an H2D stream, device->host copies on a D2H stream, and compute on the current stream, ordered by events:
// a slot is overwritten only after the compute stream released it, compute uses a slot only after its load
// landed, and a gradient is copied out only after the compute that produced it. On the CPU every call is a
// plain synchronous copy. Busy time per resource comes from CUDA events (GPU time) or wall clock (CPU).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/optim/cpu_adamw.h"
#include "engine/runtime/step_trace.h"

namespace slide {

struct QueueBusy {
  double compute = 0;  // seconds
  double h2d = 0;
  double d2h = 0;
  double device_update = 0;  // streamed updates finished since the last call: upload to download, per unit
};

// One host-held unit's AdamW run on the device (DeviceQueue::StreamUpdate): its fp32 state in host memory, the
// gradient and the compute-dtype weights the update writes (host; `out` may be the gradient's own buffer, as
// each chunk's gradient is uploaded before its weights come back), all page-locked on CUDA, and the parameter
// ranges [offset, offset + numel) with their own step arguments (weight decay differs per parameter).
struct HostUnitUpdate {
  at::Tensor master, exp_avg, exp_avg_sq;  // fp32 [n]
  at::Tensor grad;                         // bf16 or fp32 [n]
  at::Tensor out;                          // bf16 [n]
  struct Range {
    int64_t offset, numel;
    AdamWStepArgs args;
  };
  std::vector<Range> ranges;
};

class DeviceQueue {
 public:
  DeviceQueue(c10::Device device, int num_slots);
  ~DeviceQueue();

  // Host memory the device copies from/to: whole aligned pages, page-locked with cudaHostRegister on CUDA (LibTorch's
  // pinned allocator rounds each block up to a power of two), plain memory otherwise. Stays registered
  // while this queue lives.
  at::Tensor AllocateHost(int64_t numel, c10::ScalarType dtype);
  int64_t pinned_bytes() const { return pinned_bytes_; }  // page-locked by AllocateHost so far (0 on the CPU)

  // Copies host `src` (pinned on CUDA) into the device buffer `dst` of `slot`, once compute has released the
  // slot's previous contents. `src` must stay unchanged until a later UseSlot(slot) compute has run.
  // `after_update` >= 0: the copy also waits for that unit's last streamed update to have written `src` back.
  // Returns a function (callable from any thread) that returns once the copy has read `src`.
  std::function<void()> LoadSlot(int slot, at::Tensor dst, const at::Tensor& src, int64_t after_update = -1);
  void UseSlot(int slot);      // compute waits for the slot's last load
  void ReleaseSlot(int slot);  // compute enqueued so far is the last use of the slot's contents

  // Copies device `src` to host `dst` after the compute enqueued so far. Call the returned function (from any
  // thread) before reading `dst`.
  std::function<void()> Offload(at::Tensor dst, const at::Tensor& src);

  // Layer inputs kept in host memory between the forward and the backward, both copies asynchronous. Park: device
  // `src` into host `dst` (an Offload) once the last Unpark of `index` has read `dst`. Unpark: host `src` back into
  // the device buffer `dst` of `slot` (a LoadSlot: after compute released the slot's previous contents; compute
  // waits for it through UseSlot) once index's Park has landed. On the CPU both are plain copies.
  void Park(int64_t index, at::Tensor dst, const at::Tensor& src);
  void Unpark(int64_t index, int slot, at::Tensor dst, const at::Tensor& src);

  // Streamed updates: the device runs AdamW for units whose state stays in host memory, adding the copy engines'
  // bandwidth to the CPU's. Each unit goes through a ring of `ring` device buffers of `chunk` elements on an
  // upload stream (state and gradient up, then the kernel) and a download stream (state and weights back); a
  // chunk's buffer is reused only after its download. Call once, before the first StreamUpdate.
  void EnableStreamedUpdates(int64_t chunk, int ring, size_t num_units, SimdLevel simd);
  // Enqueues `update` of `unit` (on the CPU it runs the same chunks at once). Call from one thread at a time;
  // the host buffers must not be touched until SyncStreamedUpdates or a load that waited for the unit.
  void StreamUpdate(size_t unit, const HostUnitUpdate& update);
  void SyncStreamedUpdates();  // every streamed update has written back

  void BeginCompute();  // brackets a compute segment for busy-time accounting
  void EndCompute();

  // Busy time since the last call; waits for the device to finish. With `spans`, also each compute, H2D and D2H
  // segment on the host clock (lanes gpu.compute / gpu.h2d / gpu.d2h).
  QueueBusy TakeBusy(std::vector<TraceSpan>* spans = nullptr);

 private:
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
  std::vector<void*> registered_;
  int64_t pinned_bytes_ = 0;
  QueueBusy cpu_busy_;
  std::mutex cpu_update_mu_;          // cpu_busy_.device_update is added from the thread that streams updates
  std::vector<TraceSpan> cpu_spans_;  // the CPU device's segments (wall clock), for TakeBusy
  double compute_t0_ = 0;
  // Streamed updates: the ring's device buffers (per slot: master, exp_avg, exp_avg_sq and gradient as fp32,
  // the weights in bf16), the chunk size, and the CPU body's SIMD level for the CPU device.
  void RunRanges(int slot, int64_t begin, int64_t len, const HostUnitUpdate& update);  // AdamW on a ring slot
  c10::Device device_;
  std::vector<at::Tensor> ring_state_, ring_grad_, ring_out_;
  int64_t chunk_ = 0;
  int64_t next_ring_slot_ = 0;
  SimdLevel simd_ = SimdLevel::kScalar;
};

}  // namespace slide
