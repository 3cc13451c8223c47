#include "tests/support/fixtures.h"

#include "engine/model/hf_checkpoint.h"
#include "engine/model/transformer.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <ftw.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace slide::testing {

std::string FixturePath(const std::string& relative) { return std::string(SLIDE_FIXTURES_DIR) + "/" + relative; }

const std::vector<std::string>& FixtureArchitectures() {
  static const std::vector<std::string> names = {"llama3", "llama32", "qwen2", "qwen3", "mistral"};
  return names;
}

ModelFixture ModelFixture::Load(const std::string& name) {
  ModelFixture f;
  f.name = name;
  f.dir = FixturePath("models/" + name);
  f.config = ValueOrDie(LoadHfConfig(f.dir));
  f.reference = ValueOrDie(SafetensorsFile::Open(f.dir + "/reference.safetensors"));
  std::ifstream in(f.dir + "/training.json");
  f.training = nlohmann::json::parse(in);
  return f;
}

at::Tensor ModelFixture::Ref(const std::string& tensor) const {
  const SafetensorsEntry* e = reference->Find(tensor);
  if (e == nullptr) throw std::runtime_error("fixture " + name + " has no tensor " + tensor);
  return ValueOrDie(reference->Read(*e));
}

TensorDiff Compare(const at::Tensor& actual, const at::Tensor& expected) {
  at::Tensor a = actual.detach().to(at::kDouble).cpu(), b = expected.detach().to(at::kDouble).cpu();
  EXPECT_EQ(a.sizes(), b.sizes());
  TensorDiff d;
  d.max_abs = (a - b).abs().max().item<double>();
  d.ref_scale = std::max(b.abs().max().item<double>(), 1e-30);
  d.rel = d.max_abs / d.ref_scale;
  d.norm_rel = (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
  return d;
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/slide-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

// POSIX rather than std::filesystem::remove_all: LibTorch's libraries carry their own std::filesystem, and
// on some hosts its remove_all is the definition the loader binds (a crash on the GPU box).
TempDir::~TempDir() {
  nftw(
      path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

TrainerOptions FixtureTrainerOptions(const nlohmann::json& t) {
  TrainerOptions o;
  o.adamw.beta1 = t["beta1"];
  o.adamw.beta2 = t["beta2"];
  o.adamw.eps = t["eps"];
  o.adamw.weight_decay = t["weight_decay"];
  o.max_grad_norm = t["max_grad_norm"];
  const std::string sched = t["schedule"];
  // transformers' constant_with_warmup is this engine's constant (which warms up when asked to).
  o.schedule.kind =
      sched == "constant_with_warmup" ? LrScheduleKind::kConstant : ValueOrDie(ParseLrScheduleKind(sched));
  o.schedule.peak_lr = t["lr"];
  o.schedule.warmup_steps = t["warmup_steps"];
  o.schedule.total_steps = t["steps"];
  o.compute_dtype = c10::kFloat;
  o.loss.chunk_tokens = 20;
  return o;
}

std::vector<MicroBatch> RandomMicroBatches(uint64_t seed, int64_t accum, int64_t vocab, c10::Device device) {
  at::manual_seed(seed);
  std::vector<MicroBatch> mbs;
  for (int64_t m = 0; m < accum; ++m) {
    at::Tensor ids = at::randint(0, vocab, {2, 16}, at::kLong);
    at::Tensor labels = ids.clone();
    labels.narrow(1, 0, 2 + m).fill_(-100);
    mbs.push_back({ids.to(device), ShiftLabels(labels).to(device)});
  }
  return mbs;
}

ModelParams RepeatedLayers(const ModelFixture& fx, ModelConfig* cfg, int64_t layers) {
  ModelParams init = ValueOrDie(LoadHfCheckpoint(fx.dir, fx.config, c10::kFloat));
  cfg->num_layers = layers;
  ModelParams params = ZeroParams(BuildModelLayout(*cfg), at::TensorOptions().dtype(at::kFloat));
  params.units.front().copy_(init.units.front());
  params.units.back().copy_(init.units.back());
  for (int64_t i = 0; i < layers; ++i) params.units[1 + i].copy_(init.units[1 + i % 2] * (1.0 + 0.05 * i));
  return params;
}

FixtureTensors::FixtureTensors(const std::string& relative) {
  auto file = SafetensorsFile::Open(FixturePath(relative));
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (file.ok()) file_ = file.value();
}

at::Tensor FixtureTensors::operator[](const std::string& name) const {
  const SafetensorsEntry* e = file_ ? file_->Find(name) : nullptr;
  EXPECT_NE(e, nullptr) << name;
  if (e == nullptr) return at::Tensor();
  auto t = file_->Read(*e);
  EXPECT_TRUE(t.ok()) << name;
  return t.ok() ? t.value().contiguous() : at::Tensor();
}

AdapterPass RunAdapterPass(const ModelConfig& cfg, const ModelParams& base, const AdapterLayout& layout,
                           const std::vector<at::Tensor>& adapter, double scale, const at::Tensor& ids,
                           const at::Tensor& labels, c10::ScalarType dtype) {
  AdapterPass pass;
  std::vector<LayerAdapter> adapters;
  for (size_t i = 0; i < adapter.size(); ++i) {
    pass.leaves.push_back(adapter[i].to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
    adapters.push_back({&layout.layers[i], pass.leaves.back(), scale, 0, 0});
  }
  const at::Tensor targets = ShiftLabels(labels);
  {
    c10::InferenceMode no_grad;
    pass.logits = ModelLogits(cfg, base, ids, &adapters);
  }
  pass.loss =
      ModelLoss(cfg, base, ids, targets, CountValidTargets(targets), LossOptions{.chunk_tokens = 24}, &adapters);
  pass.loss.backward();
  return pass;
}

}  // namespace slide::testing
