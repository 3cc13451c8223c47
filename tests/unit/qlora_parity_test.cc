// QLoRA against transformers + bitsandbytes + PEFT (fixtures from scripts/make_qlora_fixtures.py: the tiny llama3 and
// mistral models loaded in 4 bits on the CPU, NF4 with double quantisation, saved as save_pretrained writes them;
// PEFT trains the LoRA fixture's initial adapter over them in fp32). The engine reads the saved 4-bit base as it is
// (no requantisation), and over its dequantised weights the logits, loss and adapter gradients, a 5-step AdamW
// trajectory, and the sliding trainer over the NF4 arrays themselves, match PEFT's. The tolerances are the fp32
// LoRA parity test's: both sides compute in fp32 over the same dequantised weights (bitsandbytes' CPU dequantisation
// is the product NF4[code] * absmax that engine/quant computes, nf4_test.cc), so only the order of float sums
// differs. Also what a 4-bit checkpoint the engine does not read gets.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/model/hf_checkpoint.h"
#include "engine/model/peft_adapter.h"
#include "engine/model/safetensors.h"
#include "engine/quant/bnb_4bit.h"
#include "engine/runtime/lora_reference_trainer.h"
#include "engine/runtime/sliding_trainer.h"
#include "tests/support/expect_contains.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

using testing::Compare;
using testing::ExpectContains;
using testing::ModelFixture;
using testing::TempDir;
using testing::ValueOrDie;

const std::vector<std::string> kFamilies = {"llama3", "mistral"};

// The family's QLoRA fixture: tests/fixtures/models/<family>/qlora/ (and the LoRA fixture's initial adapter).
struct QLoraFixture {
  ModelFixture model;
  std::string dir;
  testing::FixtureTensors reference;
  nlohmann::json training;

  explicit QLoraFixture(const std::string& family)
      : model(ModelFixture::Load(family)),
        dir(testing::FixturePath("models/" + family + "/qlora")),
        reference("models/" + family + "/qlora/reference.safetensors") {
    std::ifstream in(dir + "/training.json");
    training = nlohmann::json::parse(in);
  }
  std::string base_dir() const { return dir + "/base"; }
  std::string lora_dir() const { return testing::FixturePath("models/" + model.name + "/lora"); }
};

// The saved base as the engine reads it: the edges in fp32 and the layers' NF4 arrays.
struct ReadBase {
  ModelParams edges;
  std::vector<Nf4Unit> layers;
};

ReadBase Read(const QLoraFixture& fx) {
  ReadBase b;
  b.edges.layout = BuildModelLayout(fx.model.config);
  b.edges.units.resize(b.edges.layout.units.size());
  EXPECT_OK(LoadHfCheckpointUnits(fx.base_dir(), fx.model.config, c10::kFloat, [&](size_t u, LoadedUnit&& loaded) {
    if (loaded.nf4)
      b.layers.push_back(std::move(*loaded.nf4));
    else
      b.edges.units[u] = std::move(loaded.flat);
    return Status::Ok();
  }));
  return b;
}

// Its weights dequantised (fp32).
ModelParams Dequantised(const ReadBase& b) {
  ModelParams out = b.edges;
  for (size_t l = 0; l < b.layers.size(); ++l) {
    out.units[1 + l] = at::zeros({b.edges.layout.layer(l).numel});
    DequantizeNf4Unit(b.edges.layout.layer(l), b.layers[l], out.units[1 + l]);
  }
  return out;
}

class QLoraParity : public ::testing::TestWithParam<std::string> {};

TEST_P(QLoraParity, ReadsTheFourBitCheckpointAsSaved) {
  QLoraFixture fx(GetParam());
  const auto format = ValueOrDie(ReadBnb4bitFormat(fx.base_dir()));
  ASSERT_TRUE(format.has_value());
  EXPECT_TRUE(format->double_quant);
  ASSERT_OK(CheckHfCheckpoint(fx.base_dir(), fx.model.config));
  const ReadBase b = Read(fx);
  ASSERT_EQ(b.layers.size(), static_cast<size_t>(fx.model.config.num_layers));
  auto file = ValueOrDie(SafetensorsFile::Open(fx.base_dir() + "/model.safetensors"));
  const ModelParams original = ValueOrDie(LoadHfCheckpoint(fx.model.dir, fx.model.config, c10::kFloat));
  const ModelParams deq = Dequantised(b);
  for (int64_t l = 0; l < fx.model.config.num_layers; ++l) {
    const UnitLayout& layer = b.edges.layout.layer(l);
    ASSERT_TRUE(b.layers[l].double_quant);
    for (size_t p = 0; p < layer.params.size(); ++p) {
      const ParamSpec& spec = layer.params[p];
      const at::Tensor deq_w = ParamView(spec, deq.units[1 + l]), orig_w = ParamView(spec, original.units[1 + l]);
      if (spec.shape.size() != 2) {  // norms as saved
        EXPECT_TRUE(at::equal(deq_w, orig_w)) << spec.name;
        continue;
      }
      // The packed codes as stored, byte for byte.
      const Nf4UnitEntry& e = b.layers[l].entries[p];
      const at::Tensor stored = ValueOrDie(file->Read(*file->Find(spec.name))).reshape({-1});
      EXPECT_TRUE(at::equal(b.layers[l].packed.narrow(0, e.packed_at, spec.numel / 2), stored)) << spec.name;
      // Every weight within half the widest gap between NF4 codes (0.3039 of its block's absmax) of the original.
      const double err = (deq_w - orig_w).abs().max().item<double>(), scale = orig_w.abs().max().item<double>();
      EXPECT_LE(err, 0.16 * scale) << spec.name;
    }
  }
}

TEST_P(QLoraParity, Fp32LogitsLossAndAdapterGradientsEqualPeft) {
  QLoraFixture fx(GetParam());
  const ModelConfig& cfg = fx.model.config;
  const ModelParams base = Dequantised(Read(fx));
  PeftAdapter adapter = ValueOrDie(LoadPeftAdapter(fx.lora_dir(), cfg));
  const AdapterLayout layout = BuildAdapterLayout(cfg, adapter.lora);
  const testing::AdapterPass pass =
      testing::RunAdapterPass(cfg, base, layout, adapter.layers, adapter.lora.scale(), fx.model.Ref("input_ids"),
                              fx.model.Ref("labels"), c10::kFloat);
  const std::vector<at::Tensor>& leaves = pass.leaves;
  const auto dl = Compare(pass.logits, fx.reference["fp32.logits"]);
  const auto dloss = Compare(pass.loss.reshape({1}), fx.reference["fp32.loss"]);
  EXPECT_LE(dl.rel, 1e-5);
  EXPECT_LE(dloss.rel, 1e-6);
  double worst = 0;
  for (size_t i = 0; i < layout.layers.size(); ++i)
    for (const ParamSpec& p : layout.layers[i].params) {
      const auto d = Compare(ParamView(p, leaves[i].grad()), fx.reference["fp32.grad." + p.name]);
      EXPECT_LE(d.rel, 1e-5) << p.name;
      worst = std::max(worst, d.rel);
    }
  std::printf("QLORA-PEFT %-8s fp32 logits rel %.2e | loss rel %.2e | adapter grads worst %.2e\n",
              fx.model.name.c_str(), dl.rel, dloss.rel, worst);
}

// PEFT's 5 steps over its 4-bit base: the LoRA reference trainer over the dequantised base, and the sliding trainer
// over the NF4 arrays as read (bit-identical to the reference), follow them.
TEST_P(QLoraParity, FiveStepTrajectoryEqualsPeftAndTheSlidingTrainerFollows) {
  QLoraFixture fx(GetParam());
  const ModelConfig& cfg = fx.model.config;
  ReadBase read = Read(fx);
  const ModelParams base = Dequantised(read);
  const PeftAdapter initial = ValueOrDie(LoadPeftAdapter(fx.lora_dir(), cfg));
  const TrainerOptions o = testing::FixtureTrainerOptions(fx.training);
  LoraReferenceTrainer ref(cfg, base, initial.layers, initial.lora, o);
  SlidingOptions so{.train = o, .window = 1};
  so.adapter = initial.lora;
  so.nf4_base = Nf4BaseOptions{.double_quant = true};
  SlidingTrainer slide(cfg, std::move(read.edges), so, nullptr, std::move(read.layers));
  for (int64_t i = 0; i < cfg.num_layers; ++i) ASSERT_OK(slide.WriteState(0, i, initial.layers[i]));

  const int64_t steps = fx.training["steps"], micro = fx.training["micro_batch"], accum = fx.training["grad_accum"];
  const at::Tensor ids = fx.reference["train.ids"], labels = fx.reference["train.labels"];
  const at::Tensor ref_loss = fx.reference["train.loss"], ref_norm = fx.reference["train.grad_norm"];
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<MicroBatch> mbs;
    for (int64_t m = 0; m < accum; ++m)
      mbs.push_back({ids[s].narrow(0, m * micro, micro), ShiftLabels(labels[s].narrow(0, m * micro, micro))});
    const StepStats a = ref.Step(mbs), b = ValueOrDie(slide.Step(mbs));
    EXPECT_NEAR(a.loss, ref_loss[s].item<double>(), 1e-5 * ref_loss[s].item<double>()) << "step " << s;
    EXPECT_NEAR(a.grad_norm, ref_norm[s].item<double>(), 1e-5 * ref_norm[s].item<double>()) << "step " << s;
    EXPECT_EQ(a.loss, b.loss) << "step " << s;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
  }
  double worst = 0;
  const AdapterLayout& layout = ref.adapter_layout();
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    EXPECT_TRUE(at::equal(ValueOrDie(slide.ReadState(0, i)), ref.adapter()[i])) << "layer " << i;
    for (const ParamSpec& p : layout.layers[i].params) {
      const at::Tensor init = ParamView(p, initial.layers[i]);
      const auto d = Compare(ParamView(p, ref.adapter()[i]) - init, fx.reference["final." + p.name] - init);
      EXPECT_LE(d.rel, 1e-4) << p.name;
      worst = std::max(worst, d.rel);
    }
  }
  std::printf("QLORA-PEFT5 %-8s adapter updates rel %.2e (sliding trainer bit-identical to the reference)\n",
              fx.model.name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Families, QLoraParity, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Every case fails at submission (CheckHfCheckpoint), before any code is read.
// A copy of the llama3 4-bit base with `edit` applied to its tensors (and `config_edit` to its config.json).
std::string EditedBase(const TempDir& tmp, const std::function<void(NamedTensors&)>& edit,
                       const std::function<void(nlohmann::json&)>& config_edit = {}) {
  const std::string src = testing::FixturePath("models/llama3/qlora/base"), dst = tmp.File("base");
  std::filesystem::create_directories(dst);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  if (config_edit) config_edit(config);
  std::ofstream(dst + "/config.json") << config.dump(2);
  auto file = ValueOrDie(SafetensorsFile::Open(src + "/model.safetensors"));
  NamedTensors tensors;
  for (const auto& e : file->entries()) tensors.emplace_back(e.name, ValueOrDie(file->Read(e)));
  edit(tensors);
  EXPECT_OK(WriteSafetensors(dst + "/model.safetensors", tensors));
  return dst;
}

// What submission checks (the headers and the small tensors, not the codes).
Status CheckEdited(const std::string& dir) { return CheckHfCheckpoint(dir, ValueOrDie(LoadHfConfig(dir))); }

Status LoadEdited(const std::string& dir) {
  return LoadHfCheckpointUnits(dir, ValueOrDie(LoadHfConfig(dir)), c10::kFloat,
                               [](size_t, LoadedUnit&&) { return Status::Ok(); });
}

TEST(Bnb4bitCheckpoint, WhatTheEngineDoesNotReadIsRefusedNamingIt) {
  TempDir tmp;
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  auto expect = [](const Status& st, const std::string& part) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    ExpectContains(st.message(), part);
  };
  // Unread quantisations, from config.json.
  expect(CheckEdited(EditedBase(
             tmp, [](NamedTensors&) {},
             [](nlohmann::json& c) { c["quantization_config"]["bnb_4bit_quant_type"] = "fp4"; })),
         "quantization_config has bnb_4bit_quant_type 'fp4'");
  expect(CheckEdited(EditedBase(
             tmp, [](NamedTensors&) {},
             [](nlohmann::json& c) {
               c["quantization_config"]["load_in_4bit"] = false;
               c["quantization_config"]["load_in_8bit"] = true;
             })),
         "is 8-bit (load_in_8bit)");
  // A missing absmax.
  expect(
      CheckEdited(EditedBase(
          tmp, [&](NamedTensors& t) { std::erase_if(t, [&](const auto& kv) { return kv.first == q + ".absmax"; }); })),
      "checkpoint lacks tensor '" + q + ".absmax' (bitsandbytes' 4-bit state of '" + q + "')");
  // A quant_state of another type.
  expect(CheckEdited(EditedBase(tmp,
                                [&](NamedTensors& t) {
                                  for (auto& [name, v] : t)
                                    if (name == q + ".quant_state.bitsandbytes__nf4") {
                                      std::string text(reinterpret_cast<const char*>(v.data_ptr<uint8_t>()), v.numel());
                                      text.replace(text.find("\"nf4\""), 5, "\"fp4\"");
                                      v = at::from_blob(text.data(), {int64_t(text.size())}, at::kByte).clone();
                                    }
                                })),
         "tensor '" + q + ".quant_state.bitsandbytes__nf4' has quant_type 'fp4'; only nf4 is read");
  expect(LoadEdited(tmp.File("base")), "has quant_type 'fp4'; only nf4 is read");  // and the loader, on its own
  // A code book that is not NF4's.
  expect(CheckEdited(EditedBase(tmp,
                                [&](NamedTensors& t) {
                                  for (auto& [name, v] : t)
                                    if (name == q + ".quant_map") v = v.clone().mul_(0.5);
                                })),
         "tensor '" + q + ".quant_map' is not the NF4 code book");
  // Truncated packed codes.
  expect(CheckEdited(EditedBase(tmp,
                                [&](NamedTensors& t) {
                                  for (auto& [name, v] : t)
                                    if (name == q) v = v.narrow(0, 0, v.size(0) / 2).clone();
                                })),
         "tensor '" + q + "' holds 1024 bytes of 4-bit codes but config.json implies [64, 64] (2048 bytes)");
  // The whole-model loader (full fine-tuning, LoRA) refuses a 4-bit checkpoint.
  const std::string base = testing::FixturePath("models/llama3/qlora/base");
  expect(LoadHfCheckpoint(base, ValueOrDie(LoadHfConfig(base)), c10::kFloat).status(),
         "is saved in 4 bits (bitsandbytes): it trains with adapter: qlora");
}

}  // namespace
}  // namespace slide
