// SlotWindow: the device side of the sliding schedule. `window` flat slots sized for the largest layer (layer i
// in slot i % window), the embedding's and the head's buffers, the two device buffers parked layer inputs come back
// into, and the host buffers the forward parks them in (checkpoints_on_host). It records which weights version each
// slot holds, so a layer loads once per optimizer step; a resident layer's weights are its own device tensor.
// Queue slots: 0..window-1 the layers, window the embedding, window+1 the head, window+2 and +3 the parked inputs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/runtime/unit_store.h"

namespace slide {

class DeviceQueue;

class SlotWindow {
 public:
  SlotWindow(const ModelConfig& cfg, UnitStore& units, DeviceQueue& queue, int64_t window,
             const at::TensorOptions& device_opts, bool park_on_host);
  static int QueueSlots(int64_t window) { return static_cast<int>(window) + 4; }

  int64_t window() const { return window_; }
  // Layer weights: the slot's view (or a resident layer's own tensor), the queue slot, and whether it is current.
  at::Tensor LayerWeights(int64_t layer);
  bool InSlot(int64_t layer) const { return !units_[1 + layer].resident(); }
  int LayerSlot(int64_t layer) const { return static_cast<int>(layer % window_); }
  bool HoldsCurrent(int64_t layer) const;
  void MarkLoaded(int64_t layer);
  // The embedding's (head false) or the head's device buffer and queue slot.
  at::Tensor& Edge(bool head) { return head ? head_ : embed_; }
  int EdgeSlot(bool head) const { return static_cast<int>(window_) + (head ? 1 : 0); }
  bool EdgeCurrent(bool head) const { return (head ? head_version_ : embed_version_) == weights_version_; }
  void MarkEdgeLoaded(bool head) { (head ? head_version_ : embed_version_) = weights_version_; }
  // An optimizer step changed the weights (or a checkpoint replaced them): every slot and edge unit reloads.
  void NextWeightsVersion() { ++weights_version_; }

  // Layer inputs parked in host memory between forward and backward (checkpoints_on_host): Park returns what the
  // backward unparks (or x itself when inputs stay on the device); Unpark issues the copy back into buffer
  // layer % 2, which ParkedOnDevice views; the layer's compute waits for it through UseSlot(ParkedSlot(layer)).
  bool parks_on_host() const { return park_on_host_; }
  at::Tensor Park(const at::Tensor& x, int64_t layer);
  void Unpark(int64_t layer, const at::Tensor& parked);
  at::Tensor ParkedOnDevice(int64_t layer, const at::Tensor& parked);
  int ParkedSlot(int64_t layer) const { return static_cast<int>(window_ + 2 + layer % 2); }
  int64_t parked_bytes() const;  // host memory holding parked layer inputs

  // The RoPE tables for `seq_len`, built on the first step of that length and kept on the device: building them
  // takes ATen's CPU thread pool, which the update's threads hold, and made each step start ~50 ms late.
  const RopeTables& Rope(int64_t seq_len);

 private:
  const ModelConfig& cfg_;
  UnitStore& units_;
  DeviceQueue& queue_;
  const int64_t window_;
  const at::TensorOptions device_opts_;
  const bool park_on_host_;
  std::vector<at::Tensor> slots_;      // [window] flat, the largest layer's size, compute dtype
  std::vector<int64_t> slot_layer_;    // the layer each slot holds (-1: none)
  std::vector<int64_t> slot_version_;  // the weights version it was loaded at
  at::Tensor embed_, head_;
  int64_t embed_version_ = -1, head_version_ = -1;
  int64_t weights_version_ = 0;
  std::vector<at::Tensor> parked_host_;   // [layers] page-locked buffers the forward parks layer inputs in
  std::vector<at::Tensor> retired_host_;  // outgrown ones, page-locked while the queue lives
  at::Tensor parked_dev_[2];              // device buffers parked inputs come back into, by layer % 2
  int64_t rope_seq_len_ = -1;
  RopeTables rope_;
};

}  // namespace slide
