// LoRA against Hugging Face PEFT (fixtures from scripts/make_lora_fixtures.py: PEFT 0.17.1's LoRA, r 4, alpha 8,
// every projection targeted, on the tiny model of each family): the adapter read from PEFT's own files, logits,
// loss and adapter gradients in fp32 and bf16, a 5-step AdamW trajectory, the merged weights, and the adapter
// written back in PEFT's format. Also the options' and the files' validation.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/model/hf_checkpoint.h"
#include "engine/model/peft_adapter.h"
#include "engine/model/safetensors.h"
#include "engine/runtime/lora_reference_trainer.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

using testing::Compare;
using testing::ModelFixture;
using testing::TempDir;
using testing::ValueOrDie;

// The family's LoRA fixture: tests/fixtures/models/<family>/lora/.
struct LoraFixture {
  ModelFixture model;
  std::string dir;
  std::shared_ptr<SafetensorsFile> reference;
  nlohmann::json training;

  static LoraFixture Load(const std::string& family) {
    LoraFixture fx{ModelFixture::Load(family), testing::FixturePath("models/" + family + "/lora"), nullptr, {}};
    fx.reference = ValueOrDie(SafetensorsFile::Open(fx.dir + "/reference.safetensors"));
    std::ifstream in(fx.dir + "/training.json");
    fx.training = nlohmann::json::parse(in);
    return fx;
  }
  at::Tensor Ref(const std::string& name) const {
    const SafetensorsEntry* e = reference->Find(name);
    if (e == nullptr) throw std::runtime_error("no " + name + " in " + dir + "/reference.safetensors");
    return ValueOrDie(reference->Read(*e));
  }
};

class PeftParity : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftParity, ReadsPeftsFilesAsSaved) {
  LoraFixture fx = LoraFixture::Load(GetParam());
  PeftAdapter adapter = ValueOrDie(LoadPeftAdapter(fx.dir, fx.model.config));
  EXPECT_EQ(adapter.lora.r, 4);
  EXPECT_EQ(adapter.lora.alpha, 8);
  EXPECT_EQ(adapter.lora.dropout, 0);
  EXPECT_EQ(adapter.lora.target_modules.size(), 7u);
  const AdapterLayout layout = BuildAdapterLayout(fx.model.config, adapter.lora);
  ASSERT_EQ(adapter.layers.size(), static_cast<size_t>(fx.model.config.num_layers));
  auto file = ValueOrDie(SafetensorsFile::Open(fx.dir + "/adapter_model.safetensors"));
  EXPECT_EQ(file->entries().size(), static_cast<size_t>(2 * 7 * fx.model.config.num_layers));
  for (size_t i = 0; i < layout.layers.size(); ++i)
    for (const ParamSpec& p : layout.layers[i].params)
      EXPECT_TRUE(at::equal(ParamView(p, adapter.layers[i]), ValueOrDie(file->Read(*file->Find(p.name))))) << p.name;
  // The trainable count PEFT prints (print_trainable_parameters).
  int64_t peft_count = 0;
  for (const auto& e : file->entries()) peft_count += e.shape[0] * e.shape[1];
  EXPECT_EQ(layout.TrainableParams(), peft_count);
}

void CheckAgainstPeft(const LoraFixture& fx, c10::ScalarType dtype) {
  const std::string tag = dtype == c10::kFloat ? "fp32" : "bf16";
  const ModelConfig& cfg = fx.model.config;
  PeftAdapter adapter = ValueOrDie(LoadPeftAdapter(fx.dir, cfg));
  ModelParams base = ValueOrDie(LoadHfCheckpoint(fx.model.dir, cfg, c10::kFloat)).To(at::TensorOptions().dtype(dtype));
  const AdapterLayout layout = BuildAdapterLayout(cfg, adapter.lora);
  const testing::AdapterPass pass = testing::RunAdapterPass(cfg, base, layout, adapter.layers, adapter.lora.scale(),
                                                            fx.Ref("input_ids"), fx.Ref("labels"), dtype);
  const std::vector<at::Tensor>& leaves = pass.leaves;
  auto dl = Compare(pass.logits, fx.Ref(tag + ".logits"));
  auto dloss = Compare(pass.loss.reshape({1}), fx.Ref(tag + ".loss"));
  double worst = 0;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    for (const ParamSpec& p : layout.layers[i].params) {
      auto d = Compare(ParamView(p, leaves[i].grad()), fx.Ref(tag + ".grad." + p.name));
      if (dtype == c10::kFloat)
        EXPECT_LE(d.rel, 1e-5) << p.name << " max_abs " << d.max_abs;
      else
        EXPECT_LE(d.norm_rel, 3e-2) << p.name;
      worst = std::max(worst, dtype == c10::kFloat ? d.rel : d.norm_rel);
    }
  }
  for (const auto& views : base.units) EXPECT_FALSE(views.requires_grad());  // the base stays frozen
  if (dtype == c10::kFloat) {
    EXPECT_LE(dl.rel, 1e-5);
    EXPECT_LE(dloss.rel, 1e-6);
  } else {
    EXPECT_LE(dl.norm_rel, 3e-2);
    EXPECT_LE(dloss.rel, 3e-2);
  }
  std::printf("PEFT %-8s %s logits rel %.2e norm_rel %.2e | loss rel %.2e | adapter grads worst %.2e\n",
              fx.model.name.c_str(), tag.c_str(), dl.rel, dl.norm_rel, dloss.rel, worst);
}

TEST_P(PeftParity, Fp32LogitsLossAndAdapterGradients) { CheckAgainstPeft(LoraFixture::Load(GetParam()), c10::kFloat); }

TEST_P(PeftParity, Bf16LogitsLossAndAdapterGradients) {
  CheckAgainstPeft(LoraFixture::Load(GetParam()), c10::kBFloat16);
}

TEST_P(PeftParity, FiveStepTrajectoryMergeAndExport) {
  LoraFixture fx = LoraFixture::Load(GetParam());
  const ModelConfig& cfg = fx.model.config;
  PeftAdapter initial = ValueOrDie(LoadPeftAdapter(fx.dir, cfg));
  ModelParams base = ValueOrDie(LoadHfCheckpoint(fx.model.dir, cfg, c10::kFloat));
  LoraReferenceTrainer trainer(cfg, base, initial.layers, initial.lora, testing::FixtureTrainerOptions(fx.training));

  const int64_t steps = fx.training["steps"], micro = fx.training["micro_batch"], accum = fx.training["grad_accum"];
  at::Tensor ids = fx.Ref("train.ids"), labels = fx.Ref("train.labels");
  at::Tensor ref_loss = fx.Ref("train.loss"), ref_norm = fx.Ref("train.grad_norm"), ref_lr = fx.Ref("train.lr");
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<MicroBatch> mbs;
    for (int64_t m = 0; m < accum; ++m)
      mbs.push_back({ids[s].narrow(0, m * micro, micro), ShiftLabels(labels[s].narrow(0, m * micro, micro))});
    StepStats st = trainer.Step(mbs);
    EXPECT_NEAR(st.lr, ref_lr[s].item<double>(), 1e-12) << "step " << s;
    EXPECT_NEAR(st.grad_norm, ref_norm[s].item<double>(), 1e-5 * ref_norm[s].item<double>()) << "step " << s;
    EXPECT_NEAR(st.loss, ref_loss[s].item<double>(), 1e-5 * ref_loss[s].item<double>()) << "step " << s;
  }
  // The adapters' change against PEFT's, relative to PEFT's largest change in each tensor (as the full trainer's
  // trajectory test compares: Adam turns gradient noise into whole steps where a gradient nearly cancels).
  double worst = 0;
  const AdapterLayout& layout = trainer.adapter_layout();
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    for (const ParamSpec& p : layout.layers[i].params) {
      at::Tensor init = ParamView(p, initial.layers[i]);
      auto d = Compare(ParamView(p, trainer.adapter()[i]) - init, fx.Ref("final." + p.name) - init);
      EXPECT_LE(d.rel, 1e-4) << p.name;
      worst = std::max(worst, d.rel);
    }
  }
  // Merged weights as merge_and_unload writes them.
  ModelParams merged = base.To(at::TensorOptions().dtype(at::kFloat));
  double worst_merge = 0;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    MergeAdapter(merged.layout.layer(i), merged.units[1 + i], layout.layers[i], trainer.adapter()[i],
                 initial.lora.scale());
    for (const ParamSpec& p : merged.layout.layer(i).params) {
      if (p.local.find("_proj.weight") == std::string::npos) continue;
      auto d = Compare(ParamView(p, merged.units[1 + i]), fx.Ref("merged." + p.name));
      EXPECT_LE(d.rel, 1e-5) << p.name;
      worst_merge = std::max(worst_merge, d.rel);
    }
  }
  // Written in PEFT's format and read back: the same tensors and options.
  TempDir tmp;
  OutputDirectory out = ValueOrDie(OutputDirectory::Open(tmp.path(), {tmp.path()}));
  ASSERT_OK(ExportPeftAdapter(out, initial.lora, layout, trainer.adapter(), "meta-llama/Llama-3.1-8B"));
  PeftAdapter back = ValueOrDie(LoadPeftAdapter(tmp.path(), cfg));
  EXPECT_EQ(back.lora.r, initial.lora.r);
  EXPECT_EQ(back.lora.alpha, initial.lora.alpha);
  EXPECT_EQ(back.lora.target_modules, initial.lora.target_modules);
  for (size_t i = 0; i < back.layers.size(); ++i) EXPECT_TRUE(at::equal(back.layers[i], trainer.adapter()[i]));
  std::ifstream in(tmp.File("adapter_config.json"));
  const nlohmann::json written = nlohmann::json::parse(in);
  EXPECT_EQ(written["peft_type"], "LORA");
  EXPECT_EQ(written["task_type"], "CAUSAL_LM");
  EXPECT_EQ(written["bias"], "none");
  EXPECT_EQ(written["base_model_name_or_path"], "meta-llama/Llama-3.1-8B");
  std::printf("PEFT5 %-8s adapter updates rel %.2e | merged weights rel %.2e\n", fx.model.name.c_str(), worst,
              worst_merge);
}

INSTANTIATE_TEST_SUITE_P(Families, PeftParity, ::testing::ValuesIn(testing::FixtureArchitectures()),
                         [](const auto& info) { return info.param; });

TEST(LoraOptions, RefusesWhatPeftWouldNotTrain) {
  ModelFixture fx = ModelFixture::Load("llama3");
  LoraOptions ok;
  ok.r = 4;
  ASSERT_OK(ValidateLoraOptions(ok, fx.config));
  auto refused = [&](LoraOptions o, const std::string& needle) {
    Status st = ValidateLoraOptions(o, fx.config);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  LoraOptions o = ok;
  o.r = 0;
  refused(o, "lora_r must be positive");
  o = ok;
  o.r = 65;  // the projections are [64, 64] and [32, 64]: the smaller dimension bounds r
  refused(o, "exceeds the smaller dimension of self_attn.q_proj [64, 64]");
  o = ok;
  o.target_modules = {"q_proj", "lm_head"};
  refused(o, "no module \"lm_head\"");
  o.target_modules = {"q_proj", "q_proj"};
  refused(o, "twice");
  o.target_modules = {};
  refused(o, "names no module");
  o = ok;
  o.dropout = 1;
  refused(o, "lora_dropout");
  o = ok;
  o.alpha = 0;
  refused(o, "lora_alpha");
}

TEST(LoraOptions, FreshAdapterIsKaimingUniformAWithZeroB) {
  ModelFixture fx = ModelFixture::Load("llama3");
  LoraOptions lora;
  lora.r = 8;
  const AdapterLayout layout = BuildAdapterLayout(fx.config, lora);
  std::vector<at::Tensor> a = InitAdapter(layout, 7), b = InitAdapter(layout, 7), c = InitAdapter(layout, 8);
  EXPECT_TRUE(at::equal(a[0], b[0]));
  EXPECT_FALSE(at::equal(a[0], c[0]));
  for (const ParamSpec& p : layout.layers[1].params) {
    at::Tensor v = ParamView(p, a[1]);
    if (p.local.find("lora_B") != std::string::npos) {
      EXPECT_EQ(v.abs().max().item<float>(), 0) << p.name;
    } else {
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.shape[1]));
      EXPECT_LE(v.abs().max().item<double>(), bound) << p.name;
      EXPECT_GT(v.abs().max().item<double>(), 0.8 * bound) << p.name;  // spread over the range, not a constant
    }
  }
  // Zero B: the adapted model's logits are the base model's.
  ModelParams base = ValueOrDie(LoadHfCheckpoint(fx.dir, fx.config, c10::kFloat));
  TrainerOptions options;
  options.compute_dtype = c10::kFloat;
  LoraReferenceTrainer trainer(fx.config, base, a, lora, options);
  at::Tensor ids = fx.Ref("input_ids");
  EXPECT_TRUE(at::equal(trainer.Logits(ids), ModelLogits(fx.config, base, ids)));
}

TEST(LoraOptions, DropoutMasksFollowTheSeedAlone) {
  ModelFixture fx = ModelFixture::Load("qwen2");
  LoraOptions lora;
  lora.r = 4;
  lora.dropout = 0.3;
  const AdapterLayout layout = BuildAdapterLayout(fx.config, lora);
  std::vector<at::Tensor> init = InitAdapter(layout, 1);
  for (auto& t : init) t.normal_(0, 0.1);  // B non-zero, so the adapter's term (and its dropout) shows
  at::Tensor x = at::randn({2, 5, fx.config.hidden_size});
  LayerAdapter adapter{&layout.layers[0], init[0], lora.scale(), lora.dropout, AdapterDropoutSeed(0, 3, 1, 0)};
  at::Tensor first = AdapterDelta(adapter, "self_attn.q_proj", x);
  at::randn({100});  // the device's default generator moves on; the masks must not
  EXPECT_TRUE(at::equal(first, AdapterDelta(adapter, "self_attn.q_proj", x)));
  LayerAdapter other_step = adapter;
  other_step.dropout_seed = AdapterDropoutSeed(0, 4, 1, 0);
  EXPECT_FALSE(at::equal(first, AdapterDelta(other_step, "self_attn.q_proj", x)));
  LayerAdapter none = adapter;
  none.dropout = 0;
  at::Tensor full = AdapterDelta(none, "self_attn.q_proj", x);
  EXPECT_FALSE(at::allclose(first, full));
  // The dropout is on the input: a projection through A of the input with its dropped elements zeroed and the kept
  // ones scaled by 1 / (1 - p). With x's elements all equal to one, every row of dropout(x) A^T is a sum over kept
  // columns, so the mean over many rows recovers full (undropped) behaviour within sampling error.
  at::Tensor ones = at::ones({64, 64, fx.config.hidden_size});
  at::Tensor dropped = AdapterDelta(adapter, "self_attn.q_proj", ones).mean(at::IntArrayRef{0, 1});
  at::Tensor exact = AdapterDelta(none, "self_attn.q_proj", ones).mean(at::IntArrayRef{0, 1});
  EXPECT_LT(Compare(dropped, exact).norm_rel, 0.05);
  // Two projections of one layer get independent masks (PEFT: one Dropout module per projection).
  at::Tensor k_drop = AdapterDelta(adapter, "self_attn.k_proj", ones) / AdapterDelta(none, "self_attn.k_proj", ones);
  EXPECT_TRUE(at::isfinite(k_drop).all().item<bool>());
}

// Files PEFT may write that this engine does not train are refused naming the field; broken tensors name the tensor.
TEST(PeftAdapterFiles, RefusedNamingTheFieldOrTensor) {
  ModelFixture fx = ModelFixture::Load("llama3");
  const std::string src = testing::FixturePath("models/llama3/lora");
  std::ifstream in(src + "/adapter_config.json");
  const nlohmann::json good = nlohmann::json::parse(in);
  auto tensors_file = ValueOrDie(SafetensorsFile::Open(src + "/adapter_model.safetensors"));
  NamedTensors tensors;
  for (const auto& e : tensors_file->entries()) tensors.emplace_back(e.name, ValueOrDie(tensors_file->Read(e)));

  auto refused = [&](const nlohmann::json& config, const NamedTensors& weights, const std::string& needle) {
    TempDir dir;
    std::ofstream(dir.File("adapter_config.json")) << config.dump();
    ASSERT_OK(WriteSafetensors(dir.File("adapter_model.safetensors"), weights));
    auto loaded = LoadPeftAdapter(dir.path(), fx.config);
    ASSERT_FALSE(loaded.ok()) << needle;
    EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(loaded.status().message().find(needle), std::string::npos) << loaded.status().message();
  };
  nlohmann::json c = good;
  c["use_dora"] = true;
  refused(c, tensors, "use_dora = true is not supported");
  c = good;
  c["peft_type"] = "IA3";
  refused(c, tensors, "peft_type must be \"LORA\"");
  c = good;
  c["rank_pattern"] = {{"q_proj", 8}};
  refused(c, tensors, "rank_pattern");
  c = good;
  c["target_modules"] = ".*proj";
  refused(c, tensors, "regular expressions are not supported");
  c = good;
  c["target_modules"] = {"q_proj", "c_attn"};
  refused(c, tensors, "no module \"c_attn\"");
  c = good;
  c["r"] = 8;
  refused(c, tensors, "has shape [4, 64], the adapter needs [8, 64]");  // r in the config against the file
  NamedTensors missing(tensors.begin() + 1, tensors.end());
  refused(good, missing, "is missing");
  NamedTensors extra = tensors;
  extra.emplace_back("base_model.model.lm_head.weight", at::zeros({128, 64}));
  refused(good, extra, "base_model.model.lm_head.weight is not part of");
  NamedTensors nan = tensors;
  nan[0].second = nan[0].second.clone().fill_(NAN);
  refused(good, nan, "is not finite");
  TempDir empty;
  auto none = LoadPeftAdapter(empty.path(), fx.config);
  EXPECT_NE(none.status().message().find("not a PEFT adapter directory"), std::string::npos);
}

}  // namespace
}  // namespace slide
