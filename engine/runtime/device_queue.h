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
#include <vector>

#include "engine/runtime/step_trace.h"

namespace slide {

struct QueueBusy {
  double compute = 0;  // seconds
  double h2d = 0;
  double d2h = 0;
};

class DeviceQueue {
 public:
  DeviceQueue(c10::Device device, int num_slots);
  ~DeviceQueue();

  // Host memory the device copies from/to: page-locked with cudaHostRegister on CUDA (exact size; LibTorch's
  // pinned allocator rounds each block up to a power of two), plain memory otherwise. Stays registered
  // while this queue lives.
  at::Tensor AllocateHost(int64_t numel, c10::ScalarType dtype);
  int64_t pinned_bytes() const { return pinned_bytes_; }  // page-locked by AllocateHost so far (0 on the CPU)

  // Copies host `src` (pinned on CUDA) into the device buffer `dst` of `slot`, once compute has released the
  // slot's previous contents. `src` must stay unchanged until a later UseSlot(slot) compute has run.
  void LoadSlot(int slot, at::Tensor dst, const at::Tensor& src);
  void UseSlot(int slot);      // compute waits for the slot's last load
  void ReleaseSlot(int slot);  // compute enqueued so far is the last use of the slot's contents

  // Copies device `src` to host `dst` after the compute enqueued so far. Call the returned function (from any
  // thread) before reading `dst`.
  std::function<void()> Offload(at::Tensor dst, const at::Tensor& src);

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
  std::vector<TraceSpan> cpu_spans_;  // the CPU device's segments (wall clock), for TakeBusy
  double compute_t0_ = 0;
};

}  // namespace slide
