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
#include "engine/optim/moment_layout.h"
#include "engine/optim/optimizer_kind.h"

namespace slide {

// One host-held unit's AdamW: its state in host memory (the fp32 master; the moments as the unit's MomentLayout
// lays them out: fp32 for adamw, adamw_8bit's bytes), the gradient and the compute-dtype weights the update writes
// (host; `out` may be the gradient's own buffer, as each chunk's gradient is uploaded before its weights come back),
// all page-locked on CUDA, and the parameter ranges [offset, offset + numel) with their own step arguments (weight
// decay differs per parameter) and where their moments lie in the moment buffers.
struct HostUnitUpdate {
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  at::Tensor master;               // fp32 [n]
  at::Tensor exp_avg, exp_avg_sq;  // fp32 [n] (adamw) or bytes [MomentLayout::bytes()] (adamw_8bit)
  at::Tensor grad;                 // bf16 or fp32 [n]
  at::Tensor out;                  // bf16 [n]
  struct Range {
    int64_t offset, numel;
    AdamWStepArgs args;
    MomentLayout::Param moments;  // byte offsets in exp_avg / exp_avg_sq
  };
  std::vector<Range> ranges;
};

// One trip through a ring slot: elements [begin, begin + len) of the unit (master, gradient, weights) and the byte
// pieces of each moment buffer that hold their state, with where each goes in the slot's moment region (the same
// pieces for exp_avg and exp_avg_sq: their layouts are the same). fp32 AdamW chunks the unit's elements evenly (its
// moments lie at the elements' own offsets); 8-bit AdamW goes parameter by parameter, a quantised parameter in whole
// blocks (chunk rounded down to kQuantBlock: its absmax, then its codes) and a small one as fp32 values.
struct StreamChunk {
  int64_t begin = 0, len = 0;
  int range = -1;  // adamw_8bit: the one parameter range the chunk lies in
  struct Bytes {
    int64_t host, slot, size;
  };
  std::vector<Bytes> moment_bytes;
};
std::vector<StreamChunk> PlanStreamChunks(const HostUnitUpdate& update, int64_t chunk);

// `ring` slots of `chunk` elements on `device`: per slot the fp32 state (master | exp_avg | exp_avg_sq, each moment
// region 4 x chunk bytes, which also holds a chunk of 8-bit codes and its absmax), the gradient (fp32, or bf16 in its
// first half) and the bf16 weights the update writes.
class AdamWRing {
 public:
  AdamWRing(c10::Device device, int64_t chunk, int ring, SimdLevel simd);
  int size() const { return static_cast<int>(state_.size()); }
  int64_t chunk() const { return chunk_; }
  int NextSlot() { return static_cast<int>(next_++ % size()); }
  at::Tensor& state(int slot) { return state_[slot]; }  // fp32 [3 x chunk]
  at::Tensor master(int slot) { return state_[slot].narrow(0, 0, chunk_); }
  // Moment `which` (0: exp_avg, 1: exp_avg_sq) of `slot` as bytes [4 x chunk]: StreamChunk::Bytes::slot indexes it.
  at::Tensor moment_bytes(int slot, int which);
  at::Tensor grad(int slot, c10::ScalarType dtype);  // [chunk] of the gradient's dtype
  at::Tensor& out(int slot) { return out_[slot]; }   // bf16 [chunk]
  // AdamW on `slot`, which holds chunk `c` of `update` (PlanStreamChunks): each parameter range that meets the chunk
  // with its own arguments (TensorAdamW / TensorAdamW8bit: on the CPU the same arithmetic as the host update, on CUDA
  // the kernels that are bit-equal to it). On the current stream.
  void Run(int slot, const StreamChunk& c, const HostUnitUpdate& update);

 private:
  int64_t chunk_;
  SimdLevel simd_;
  int64_t next_ = 0;
  std::vector<at::Tensor> state_, grad_, out_;
};

}  // namespace slide
