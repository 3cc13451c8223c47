// Loading Hugging Face model directories (single file and sharded) with validation, and exporting them.
#include "engine/model/hf_checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/expect_contains.h"
#include "tests/support/fixtures.h"

namespace fs = std::filesystem;

namespace slide {
namespace {

using testing::TempDir;
using testing::ValueOrDie;

NamedTensors ReadAll(const std::string& path) {
  auto file = ValueOrDie(SafetensorsFile::Open(path));
  NamedTensors out;
  for (const auto& e : file->entries()) out.emplace_back(e.name, ValueOrDie(file->Read(e)));
  return out;
}

// A writable copy of a single-file fixture model, with its tensors open for editing.
struct EditableModel {
  TempDir dir;
  ModelConfig cfg;
  NamedTensors tensors;
  explicit EditableModel(const std::string& fixture) {
    const std::string src = testing::FixturePath("models/" + fixture);
    fs::copy_file(src + "/config.json", dir.File("config.json"));
    cfg = ValueOrDie(LoadHfConfig(src));
    tensors = ReadAll(src + "/model.safetensors");
  }
  void Save() { EXPECT_TRUE(WriteSafetensors(dir.File("model.safetensors"), tensors).ok()); }
  Status LoadError() {
    Save();
    auto r = LoadHfCheckpoint(dir.path(), cfg, c10::kFloat);
    EXPECT_FALSE(r.ok());
    return r.status();
  }
};

using testing::ExpectContains;

TEST(HfCheckpoint, LoadsEveryFixtureWithItsValues) {
  for (const auto& name : testing::FixtureArchitectures()) {
    auto fx = testing::ModelFixture::Load(name);
    ModelParams p = ValueOrDie(LoadHfCheckpoint(fx.dir, fx.config, c10::kFloat));
    EXPECT_EQ(p.layout.units.size(), size_t(fx.config.num_layers + 2));
    int64_t n = 0;
    for (const auto& [pname, view] : p.Named()) n += view.numel();
    EXPECT_EQ(n, fx.config.TotalParamCount()) << name;
    // The fixture's HF gradient names are exactly the parameters we load.
    for (const auto& [pname, view] : p.Named()) EXPECT_NE(fx.reference->Find("fp32.grad." + pname), nullptr) << pname;
  }
}

TEST(HfCheckpoint, ShardedAndSingleFileAgree) {
  auto fx = testing::ModelFixture::Load("llama3");  // saved by HF in 8 shards + index
  ASSERT_TRUE(fs::exists(fx.dir + "/model.safetensors.index.json"));
  ModelParams p = ValueOrDie(LoadHfCheckpoint(fx.dir, fx.config, c10::kFloat));
  auto shard = ValueOrDie(SafetensorsFile::Open(fx.dir + "/model-00008-of-00008.safetensors"));
  for (const auto& e : shard->entries()) {
    bool found = false;
    for (const auto& [pname, view] : p.Named()) {
      if (pname != e.name) continue;
      found = true;
      EXPECT_TRUE(at::equal(view, ValueOrDie(shard->Read(e)))) << pname;
    }
    EXPECT_TRUE(found) << e.name;
  }
}

TEST(HfCheckpoint, ConvertsToTheRequestedDtype) {
  auto fx = testing::ModelFixture::Load("qwen2");
  ModelParams p = ValueOrDie(LoadHfCheckpoint(fx.dir, fx.config, c10::kBFloat16));
  EXPECT_EQ(p.units[0].scalar_type(), c10::kBFloat16);
}

TEST(HfCheckpoint, MissingTensorIsNamed) {
  EditableModel m("qwen2");
  m.tensors.erase(std::remove_if(m.tensors.begin(), m.tensors.end(),
                                 [](const auto& t) { return t.first == "model.layers.1.mlp.up_proj.weight"; }),
                  m.tensors.end());
  Status s = m.LoadError();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  ExpectContains(s.message(), "lacks 1 tensor(s) the config needs: model.layers.1.mlp.up_proj.weight");
}

TEST(HfCheckpoint, ExtraTensorIsNamed) {
  EditableModel m("qwen2");
  m.tensors.emplace_back("model.layers.7.mystery.weight", at::zeros({2}));
  ExpectContains(m.LoadError().message(), "tensor 'model.layers.7.mystery.weight' is not part of a qwen2 model");
}

TEST(HfCheckpoint, ShapeMismatchNamesTensorAndShapes) {
  EditableModel m("qwen2");
  for (auto& [name, t] : m.tensors)
    if (name == "model.layers.0.self_attn.k_proj.weight") t = at::zeros({31, 64});
  ExpectContains(m.LoadError().message(),
                 "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [31, 64] but config.json implies [32, 64]");
}

TEST(HfCheckpoint, IntegerTensorIsRefused) {
  EditableModel m("qwen2");
  for (auto& [name, t] : m.tensors)
    if (name == "model.norm.weight") t = at::zeros({64}, at::kInt);
  ExpectContains(m.LoadError().message(), "tensor 'model.norm.weight' has dtype I32");
}

TEST(HfCheckpoint, OldRotaryBuffersAreIgnored) {
  EditableModel m("qwen2");
  m.tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", at::zeros({8}));
  m.Save();
  EXPECT_TRUE(LoadHfCheckpoint(m.dir.path(), m.cfg, c10::kFloat).ok());
}

TEST(HfCheckpoint, BrokenIndexAndMissingFiles) {
  TempDir dir;
  auto cfg = ValueOrDie(LoadHfConfig(testing::FixturePath("models/llama3")));
  auto r = LoadHfCheckpoint(dir.path(), cfg, c10::kFloat);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  ExpectContains(r.status().message(), "no model.safetensors or model.safetensors.index.json");

  { std::ofstream(dir.File("model.safetensors.index.json")) << "{\"weight_map\": "; }
  ExpectContains(LoadHfCheckpoint(dir.path(), cfg, c10::kFloat).status().message(), "not valid JSON");

  { std::ofstream(dir.File("model.safetensors.index.json")) << R"({"weight_map": {"x": "gone.safetensors"}})"; }
  auto gone = LoadHfCheckpoint(dir.path(), cfg, c10::kFloat).status();
  EXPECT_EQ(gone.code(), StatusCode::kNotFound);
  ExpectContains(gone.message(), "names shard 'gone.safetensors'");

  { std::ofstream(dir.File("model.safetensors.index.json")) << R"({"weight_map": {"x": "../../etc/passwd"}})"; }
  ExpectContains(LoadHfCheckpoint(dir.path(), cfg, c10::kFloat).status().message(),
                 "not a file in the model directory");

  ASSERT_TRUE(WriteSafetensors(dir.File("s.safetensors"), {{"y", at::zeros({1})}}).ok());
  { std::ofstream(dir.File("model.safetensors.index.json")) << R"({"weight_map": {"x": "s.safetensors"}})"; }
  ExpectContains(LoadHfCheckpoint(dir.path(), cfg, c10::kFloat).status().message(), "does not contain it");
}

void ExpectSameParams(const ModelParams& a, const ModelParams& b) {
  auto na = a.Named(), nb = b.Named();
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(na[i].first, nb[i].first);
    EXPECT_TRUE(at::equal(na[i].second, nb[i].second)) << na[i].first;
  }
}

TEST(HfCheckpoint, ExportRoundTripsSingleAndSharded) {
  auto fx = testing::ModelFixture::Load("llama3");
  ModelParams p = ValueOrDie(LoadHfCheckpoint(fx.dir, fx.config, c10::kFloat));
  TempDir out;
  ASSERT_OK(ExportHfCheckpoint(out.path(), fx.dir, p, {.dtype = c10::kFloat}));
  EXPECT_TRUE(fs::exists(out.File("model.safetensors")));
  EXPECT_TRUE(fs::exists(out.File("generation_config.json")));
  ExpectSameParams(ValueOrDie(LoadHfCheckpoint(out.path(), fx.config, c10::kFloat)), p);

  TempDir sharded;
  ASSERT_OK(ExportHfCheckpoint(sharded.path(), fx.dir, p, {.dtype = c10::kFloat, .max_shard_bytes = 50000}));
  EXPECT_TRUE(fs::exists(sharded.File("model.safetensors.index.json")));
  EXPECT_TRUE(fs::exists(sharded.File("model-00001-of-00006.safetensors")));
  ExpectSameParams(ValueOrDie(LoadHfCheckpoint(sharded.path(), fx.config, c10::kFloat)), p);
}

TEST(HfCheckpoint, ExportWritesBf16ConfigDtypeAndNoTiedHead) {
  auto fx = testing::ModelFixture::Load("llama32");  // tied embeddings
  ModelParams p = ValueOrDie(LoadHfCheckpoint(fx.dir, fx.config, c10::kFloat));
  TempDir out;
  ASSERT_OK(ExportHfCheckpoint(out.path(), fx.dir, p));
  auto file = ValueOrDie(SafetensorsFile::Open(out.File("model.safetensors")));
  EXPECT_EQ(file->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(file->Find("model.embed_tokens.weight")->dtype, c10::kBFloat16);
  std::ifstream cfg(out.File("config.json"));
  auto json = nlohmann::json::parse(cfg);
  EXPECT_EQ(json["torch_dtype"], "bfloat16");
  EXPECT_EQ(json["rope_scaling"]["rope_type"], "llama3");
}

}  // namespace
}  // namespace slide
