#include "engine/model/lora.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>

namespace slide {
namespace {

// A targetable projection: its block, its module name, and its weight's [out, in].
struct Projection {
  std::string block;
  std::string module;
  int64_t out = 0, in = 0;
  std::string path() const { return block + "." + module; }
};

std::vector<Projection> Projections(const ModelConfig& cfg) {
  const int64_t h = cfg.hidden_size, q = cfg.q_dim(), kv = cfg.kv_dim(), ff = cfg.intermediate_size;
  return {{"self_attn", "q_proj", q, h}, {"self_attn", "k_proj", kv, h}, {"self_attn", "v_proj", kv, h},
          {"self_attn", "o_proj", h, q}, {"mlp", "gate_proj", ff, h},    {"mlp", "up_proj", ff, h},
          {"mlp", "down_proj", h, ff}};
}

// splitmix64's finaliser: distinct inputs give well-spread seeds.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

const std::vector<std::string>& LoraModuleNames() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

Status ValidateLoraOptions(const LoraOptions& lora, const ModelConfig& cfg) {
  if (lora.r < 1) return InvalidArgument("lora_r must be positive, got " + std::to_string(lora.r));
  if (!(lora.alpha > 0) || !std::isfinite(lora.alpha))
    return InvalidArgument("lora_alpha must be positive and finite, got " + std::to_string(lora.alpha));
  if (!(lora.dropout >= 0 && lora.dropout < 1))
    return InvalidArgument("lora_dropout must be in [0, 1), got " + std::to_string(lora.dropout));
  if (lora.target_modules.empty()) return InvalidArgument("lora_target_modules names no module");
  std::set<std::string> seen;
  const std::vector<Projection> projections = Projections(cfg);
  for (const std::string& name : lora.target_modules) {
    auto it =
        std::find_if(projections.begin(), projections.end(), [&](const Projection& p) { return p.module == name; });
    if (it == projections.end()) {
      std::string known;
      for (const auto& n : LoraModuleNames()) known += (known.empty() ? "" : ", ") + n;
      return InvalidArgument("lora_target_modules: this model has no module \"" + name + "\" (known: " + known + ")");
    }
    if (!seen.insert(name).second) return InvalidArgument("lora_target_modules names \"" + name + "\" twice");
    if (lora.r > std::min(it->out, it->in))
      return InvalidArgument("lora_r " + std::to_string(lora.r) + " exceeds the smaller dimension of " + it->path() +
                             " [" + std::to_string(it->out) + ", " + std::to_string(it->in) + "]");
  }
  return Status::Ok();
}

int64_t AdapterLayout::TotalNumel() const {
  int64_t n = 0;
  for (const auto& u : layers) n += u.numel;
  return n;
}

int64_t AdapterLayout::TrainableParams() const {
  int64_t n = 0;
  for (const auto& u : layers)
    for (const auto& p : u.params) n += p.numel;
  return n;
}

AdapterLayout BuildAdapterLayout(const ModelConfig& cfg, const LoraOptions& lora) {
  AdapterLayout layout;
  const std::set<std::string> targets(lora.target_modules.begin(), lora.target_modules.end());
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    UnitBuilder b(UnitKind::kAdapter, "adapter." + std::to_string(i),
                  "base_model.model.model.layers." + std::to_string(i) + ".");
    for (const Projection& p : Projections(cfg)) {  // layer order, whatever order target_modules lists
      if (targets.count(p.module) == 0) continue;
      b.Add(p.path() + ".lora_A.weight", {lora.r, p.in}, true);
      b.Add(p.path() + ".lora_B.weight", {p.out, lora.r}, true);
    }
    layout.layers.push_back(b.Take());
  }
  return layout;
}

std::vector<at::Tensor> InitAdapter(const AdapterLayout& layout, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> out;
  for (const UnitLayout& unit : layout.layers) {
    at::Tensor flat = at::zeros({unit.numel}, at::kFloat);
    for (const ParamSpec& p : unit.params) {
      if (p.local.find(".lora_A.") == std::string::npos) continue;  // B stays zero: the adapter starts as identity
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.shape[1]));
      ParamView(p, flat).uniform_(-bound, bound, gen);
    }
    out.push_back(flat);
  }
  return out;
}

uint64_t AdapterDropoutSeed(uint64_t seed, int64_t step, int64_t micro_batch, int64_t layer) {
  return Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(step)) ^ (static_cast<uint64_t>(micro_batch) << 20) ^
             static_cast<uint64_t>(layer));
}

at::Tensor AdapterDelta(const LayerAdapter& adapter, const std::string& module_path, const at::Tensor& x) {
  if (adapter.layout == nullptr) return at::Tensor();
  const ParamSpec* a = adapter.layout->Find(module_path + ".lora_A.weight");
  if (a == nullptr) return at::Tensor();
  const ParamSpec* b = adapter.layout->Find(module_path + ".lora_B.weight");
  at::Tensor input = x;
  if (adapter.dropout > 0) {
    // One generator per projection, seeded from the layer's seed and the projection's place in the layout, so
    // the masks do not depend on what ran before on this device.
    at::Generator gen;
    {
      at::Generator device_default = at::globalContext().defaultGenerator(x.device());
      std::lock_guard<std::mutex> lock(device_default.mutex());
      gen = device_default.clone();
    }
    gen.set_current_seed(Mix(adapter.dropout_seed ^ static_cast<uint64_t>(a->offset)));
    at::Tensor keep = at::empty_like(x).bernoulli_(1 - adapter.dropout, gen);
    input = x * keep.mul_(1.0 / (1 - adapter.dropout));  // as torch's dropout scales the kept elements
  }
  return at::linear(at::linear(input, ParamView(*a, adapter.flat)), ParamView(*b, adapter.flat)) * adapter.scale;
}

void MergeAdapter(const UnitLayout& base_layout, at::Tensor& base_flat, const UnitLayout& adapter_layout,
                  const at::Tensor& adapter_flat, double scale) {
  for (const ParamSpec& a : adapter_layout.params) {
    const size_t at_a = a.local.find(".lora_A.weight");
    if (at_a == std::string::npos) continue;
    const std::string path = a.local.substr(0, at_a);
    const ParamSpec* b = adapter_layout.Find(path + ".lora_B.weight");
    const ParamSpec* w = base_layout.Find(path + ".weight");
    TORCH_CHECK(b != nullptr && w != nullptr, "adapter ", adapter_layout.name, " does not match its layer at ", path);
    at::Tensor weight = ParamView(*w, base_flat);
    at::Tensor delta =
        at::matmul(ParamView(*b, adapter_flat).to(at::kFloat), ParamView(a, adapter_flat).to(at::kFloat));
    weight.copy_(weight.to(at::kFloat) + delta * scale);
  }
}

}  // namespace slide
