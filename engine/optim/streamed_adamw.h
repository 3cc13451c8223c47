// Streamed AdamW: a host unit's update run by the device, chunk by chunk through a ring of device buffers, so the
// copy engines add their bandwidth to the CPU's (SlidingOptions::device_update_share). This file holds what the
// update is (HostUnitUpdate) and the ring's buffers and arithmetic (AdamWRing); the device queue moves the chunks
// (DeviceQueue::StreamUpdate: on CUDA on an upload and a download stream, on the CPU as plain copies).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "engine/optim/cpu_adamw.h"

namespace slide {

// One host-held unit's AdamW: its fp32 state in host memory, the gradient and the compute-dtype weights the update
// writes (host; `out` may be the gradient's own buffer, as each chunk's gradient is uploaded before its weights
// come back), all page-locked on CUDA, and the parameter ranges [offset, offset + numel) with their own step
// arguments (weight decay differs per parameter).
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

// `ring` slots of `chunk` elements on `device`: per slot the fp32 state (master | exp_avg | exp_avg_sq), the
// gradient (fp32, or bf16 in its first half) and the bf16 weights the update writes.
class AdamWRing {
 public:
  AdamWRing(c10::Device device, int64_t chunk, int ring, SimdLevel simd);
  int size() const { return static_cast<int>(state_.size()); }
  int64_t chunk() const { return chunk_; }
  int NextSlot() { return static_cast<int>(next_++ % size()); }
  at::Tensor& state(int slot) { return state_[slot]; }  // fp32 [3 x chunk]
  at::Tensor grad(int slot, c10::ScalarType dtype);     // [chunk] of the gradient's dtype
  at::Tensor& out(int slot) { return out_[slot]; }      // bf16 [chunk]
  // AdamW on `slot`, which holds elements [begin, begin + len) of the unit: each parameter range that meets the
  // chunk with its own arguments (TensorAdamW: on the CPU the same arithmetic as the host update, on CUDA the
  // kernel that is bit-equal to it). On the current stream.
  void Run(int slot, int64_t begin, int64_t len, const HostUnitUpdate& update);

 private:
  int64_t chunk_;
  SimdLevel simd_;
  int64_t next_ = 0;
  std::vector<at::Tensor> state_, grad_, out_;
};

}  // namespace slide
