#include "engine/runtime/adapter_store.h"

#include <ATen/ATen.h>

#include "engine/runtime/reference_trainer.h"

namespace slide {

AdapterStore::AdapterStore(const ModelConfig& cfg, LoraOptions lora, const at::TensorOptions& device_opts)
    : lora_(std::move(lora)), layout_(BuildAdapterLayout(cfg, lora_)) {
  int64_t total = 0;
  for (const UnitLayout& u : layout_.layers) {
    offset_.push_back(total);
    total += u.numel;
  }
  const auto f32 = device_opts.dtype(at::kFloat);
  master_ = at::empty({total}, f32);
  const std::vector<at::Tensor> init = InitAdapter(layout_, lora_.seed);
  for (int64_t i = 0; i < layers(); ++i) View(master_, i).copy_(init[i]);
  exp_avg_ = at::zeros({total}, f32);
  exp_avg_sq_ = at::zeros({total}, f32);
  grad_ = at::zeros({total}, f32);
  weights_ = device_opts.dtype() == at::kFloat ? master_ : master_.to(device_opts.dtype());
}

at::Tensor AdapterStore::View(const at::Tensor& all, int64_t layer) const {
  return all.narrow(0, offset_[layer], layout_.layers[layer].numel);
}

LayerAdapter AdapterStore::Forward(int64_t layer, double dropout, uint64_t seed) const {
  return {&layout_.layers[layer], View(weights_, layer), lora_.scale(), dropout, seed};
}

at::Tensor AdapterStore::Leaf(int64_t layer) const { return View(weights_, layer).detach().requires_grad_(true); }

LayerAdapter AdapterStore::WithLeaf(int64_t layer, const at::Tensor& leaf, double dropout, uint64_t seed) const {
  return {&layout_.layers[layer], leaf, lora_.scale(), dropout, seed};
}

void AdapterStore::ZeroGrad() { grad_.zero_(); }

void AdapterStore::LandGrad(int64_t layer, const at::Tensor& grad) { View(grad_, layer).add_(grad); }

double AdapterStore::ClipGradNorm(double max_norm) {
  std::vector<at::Tensor> grads;
  for (int64_t i = 0; i < layers(); ++i) grads.push_back(View(grad_, i));
  return slide::ClipGradNorm(grads, max_norm);
}

void AdapterStore::Update(const AdamWHyper& hp, int64_t step) {
  for (int64_t i = 0; i < layers(); ++i) {
    at::Tensor p = View(master_, i), m = View(exp_avg_, i), v = View(exp_avg_sq_, i);
    AdamWReferenceStep(p, View(grad_, i), m, v, hp, step);
  }
  if (weights_.data_ptr() != master_.data_ptr()) weights_.copy_(master_);
}

at::Tensor AdapterStore::ReadState(int kind, int64_t layer) const {
  const at::Tensor& all = kind == 0 ? master_ : kind == 1 ? exp_avg_ : exp_avg_sq_;
  return View(all, layer).to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

Status AdapterStore::WriteState(int kind, int64_t layer, const at::Tensor& src) {
  if (kind < 0 || kind > 2 || layer < 0 || layer >= layers()) return InvalidArgument("no such adapter state");
  if (!src.defined() || src.numel() != layout_.layers[layer].numel)
    return InvalidArgument("adapter state of layer " + std::to_string(layer) + " needs " +
                           std::to_string(layout_.layers[layer].numel) + " values");
  at::Tensor& all = kind == 0 ? master_ : kind == 1 ? exp_avg_ : exp_avg_sq_;
  View(all, layer).copy_(src.reshape({-1}));
  if (kind == 0 && weights_.data_ptr() != master_.data_ptr()) View(weights_, layer).copy_(View(master_, layer));
  return Status::Ok();
}

std::vector<at::Tensor> AdapterStore::MasterOnHost() const {
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < layers(); ++i) out.push_back(ReadState(0, i));
  return out;
}

int64_t AdapterStore::device_bytes() const {
  const int64_t total = master_.numel();
  return total * 4 * 4 + (weights_.data_ptr() == master_.data_ptr() ? 0 : total * weights_.element_size());
}

}  // namespace slide
