// DeviceQueue: the streams of one device and the ordering between them, behind one interface with two
// implementations. On CUDA (cuda_device_queue.cc) host->device copies run on an H2D stream, device->host copies on a
// D2H stream, and compute on the current stream, ordered by events: a slot is overwritten only after the compute
// stream released it, compute uses a slot only after its load landed, and a gradient is copied out only after the
// compute that produced it; busy time comes from CUDA events. On the host (host_device_queue.cc, the device is
// the CPU: tests and CI) every call is a plain synchronous copy timed by the wall clock.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <vector>

#include "engine/memory/pinned_host_pool.h"
#include "engine/optim/cpu_adamw.h"
#include "engine/optim/streamed_adamw.h"
#include "engine/quant/nf4_unit.h"
#include "engine/runtime/step_trace.h"

namespace slide {

struct QueueBusy {
  double compute = 0;  // seconds
  double h2d = 0;
  double d2h = 0;
  double device_update = 0;  // streamed updates finished since the last call: upload to download, per unit
};

class DeviceQueue {
 public:
  virtual ~DeviceQueue() = default;

  // Host memory the device copies from/to (PinnedHostPool: page-locked on CUDA).
  at::Tensor AllocateHost(int64_t numel, c10::ScalarType dtype) { return pool_.Allocate(numel, dtype); }
  int64_t pinned_bytes() const { return pool_.locked_bytes(); }  // page-locked by AllocateHost (0 on the CPU)

  // Copies host `src` (pinned on CUDA) into the device buffer `dst` of `slot`, once compute has released the
  // slot's previous contents. `src` must stay unchanged until a later UseSlot(slot) compute has run.
  // `after_update` >= 0: the copy also waits for that unit's last streamed update to have written `src` back.
  // Returns a function (callable from any thread) that returns once the copy has read `src`.
  virtual std::function<void()> LoadSlot(int slot, at::Tensor dst, const at::Tensor& src,
                                         int64_t after_update = -1) = 0;
  // LoadSlot for a decoder layer of an NF4 base: its arrays (page-locked on CUDA) go up into one device scratch and
  // are dequantised from there into `dst` (the flat slot, compute dtype) on the copy stream, so the slot's compute
  // waits for the dequantisation as it waits for a copy (UseSlot). `src` must stay unchanged until the returned
  // function has returned or a later UseSlot(slot) compute has run.
  virtual std::function<void()> LoadSlotNf4(int slot, at::Tensor dst, const UnitLayout& layout, const Nf4Unit& src) = 0;
  virtual void UseSlot(int slot) = 0;      // compute waits for the slot's last load
  virtual void ReleaseSlot(int slot) = 0;  // compute enqueued so far is the last use of the slot's contents

  // Copies device `src` to host `dst` after the compute enqueued so far. Call the returned function (from any
  // thread) before reading `dst`.
  virtual std::function<void()> Offload(at::Tensor dst, const at::Tensor& src) = 0;

  // Layer inputs kept in host memory between the forward and the backward, both copies asynchronous. Park: device
  // `src` into host `dst` (an Offload) once the last Unpark of `index` has read `dst`. Unpark: host `src` back into
  // the device buffer `dst` of `slot` (a LoadSlot: after compute released the slot's previous contents; compute
  // waits for it through UseSlot) once index's Park has landed.
  virtual void Park(int64_t index, at::Tensor dst, const at::Tensor& src) = 0;
  virtual void Unpark(int64_t index, int slot, at::Tensor dst, const at::Tensor& src) = 0;

  // Streamed updates (streamed_adamw.h): each unit goes through a ring of `ring` device buffers of `chunk`
  // elements (state and gradient up, then the kernel, then state and weights back); a chunk's buffer is reused
  // only after its results are back. Call once, before the first StreamUpdate.
  virtual void EnableStreamedUpdates(int64_t chunk, int ring, size_t num_units, SimdLevel simd) = 0;
  // Enqueues `update` of `unit` (on the CPU it runs the same chunks at once). Call from one thread at a time;
  // the host buffers must not be touched until SyncStreamedUpdates or a load that waited for the unit.
  virtual void StreamUpdate(size_t unit, const HostUnitUpdate& update) = 0;
  virtual void SyncStreamedUpdates() = 0;  // every streamed update has written back

  virtual void BeginCompute() = 0;  // brackets a compute segment for busy-time accounting
  virtual void EndCompute() = 0;

  // Busy time since the last call; waits for the device to finish. With `spans`, also each compute, H2D and D2H
  // segment on the host clock (lanes gpu.compute / gpu.h2d / gpu.d2h).
  virtual QueueBusy TakeBusy(std::vector<TraceSpan>* spans = nullptr) = 0;

 protected:
  explicit DeviceQueue(bool page_lock) : pool_(page_lock) {}

 private:
  PinnedHostPool pool_;
};

// The queue for `device` with `num_slots` load slots: CUDA's, or the host's for the CPU. A CUDA device in a build
// without CUDA throws.
std::unique_ptr<DeviceQueue> MakeDeviceQueue(c10::Device device, int num_slots);

// The implementations (host_device_queue.cc, cuda_device_queue.cc).
std::unique_ptr<DeviceQueue> MakeHostDeviceQueue();
std::unique_ptr<DeviceQueue> MakeCudaDeviceQueue(c10::Device device, int num_slots);

}  // namespace slide
