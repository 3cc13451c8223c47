#include "engine/runtime/slot_window.h"

#include <ATen/ATen.h>

#include "engine/runtime/device_queue.h"

namespace slide {

SlotWindow::SlotWindow(const ModelConfig& cfg, UnitStore& units, DeviceQueue& queue, int64_t window,
                       const at::TensorOptions& device_opts, bool park_on_host)
    : cfg_(cfg), units_(units), queue_(queue), window_(window), device_opts_(device_opts), park_on_host_(park_on_host) {
  const int64_t slot_numel = units.largest_layer_numel();
  for (int64_t w = 0; w < window; ++w) slots_.push_back(at::empty({slot_numel}, device_opts));
  slot_layer_.assign(window, -1);
  slot_version_.assign(window, -1);
  embed_ = at::empty({units.layout().embed().numel}, device_opts);
  head_ = at::empty({units.layout().head().numel}, device_opts);
}

at::Tensor SlotWindow::LayerWeights(int64_t layer) {
  if (!InSlot(layer)) return units_[1 + layer].dev_weights;
  return slots_[LayerSlot(layer)].narrow(0, 0, units_.layout().layer(layer).numel);
}

bool SlotWindow::HoldsCurrent(int64_t layer) const {
  const int w = LayerSlot(layer);
  return slot_layer_[w] == layer && slot_version_[w] == weights_version_;
}

void SlotWindow::MarkLoaded(int64_t layer) {
  const int w = LayerSlot(layer);
  slot_layer_[w] = layer;
  slot_version_[w] = weights_version_;
}

// The layer's input goes to its own host buffer (page-locked, exactly its size: LibTorch's pinned allocator would
// round 384 MiB up to 512) on the D2H stream while the forward goes on.
at::Tensor SlotWindow::Park(const at::Tensor& x, int64_t layer) {
  if (!park_on_host_) return x;
  if (parked_host_.size() <= static_cast<size_t>(layer)) parked_host_.resize(layer + 1);
  at::Tensor& flat = parked_host_[layer];
  if (!flat.defined() || flat.numel() < x.numel()) {
    if (flat.defined()) retired_host_.push_back(flat);  // page-locked until the queue goes: keep it alive
    flat = queue_.AllocateHost(x.numel(), x.scalar_type());
  }
  at::Tensor host = flat.narrow(0, 0, x.numel()).view(x.sizes());
  queue_.Park(layer, host, x);
  return host;
}

// Into buffer layer % 2: the one the layer after it released.
void SlotWindow::Unpark(int64_t layer, const at::Tensor& parked) {
  at::Tensor& flat = parked_dev_[layer % 2];
  if (!flat.defined() || flat.numel() < parked.numel()) {
    flat = at::empty({parked.numel()}, device_opts_.dtype(parked.scalar_type()));
    queue_.ReleaseSlot(ParkedSlot(layer));  // the copy waits for compute still using this memory's last owner
  }
  queue_.Unpark(layer, ParkedSlot(layer), ParkedOnDevice(layer, parked), parked);
}

at::Tensor SlotWindow::ParkedOnDevice(int64_t layer, const at::Tensor& parked) {
  return parked_dev_[layer % 2].narrow(0, 0, parked.numel()).view(parked.sizes());
}

int64_t SlotWindow::parked_bytes() const {
  int64_t bytes = 0;
  for (const auto& t : parked_host_) bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return bytes;
}

const RopeTables& SlotWindow::Rope(int64_t seq_len) {
  if (seq_len != rope_seq_len_) {
    rope_ = BuildRopeTables(cfg_, seq_len, device_opts_);
    rope_seq_len_ = seq_len;
  }
  return rope_;
}

}  // namespace slide
