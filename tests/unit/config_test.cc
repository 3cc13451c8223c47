// HF config.json parsing: every family's flags, RoPE variants, and precise errors for bad input.
#include "engine/model/config.h"

#include <gtest/gtest.h>

#include <tuple>

#include "tests/support/fixtures.h"

namespace slide {
namespace {

using testing::ValueOrDie;

std::string Base(const std::string& extra = "") {
  return R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2)" +
         extra + "}";
}

Status ParseError(const std::string& json) {
  auto r = ParseHfConfig(json, "cfg.json");
  EXPECT_FALSE(r.ok()) << "accepted: " << json;
  return r.status();
}

TEST(HfConfig, FixtureFamilies) {
  auto llama3 = ValueOrDie(LoadHfConfig(testing::FixturePath("models/llama3")));
  EXPECT_EQ(llama3.family, ModelFamily::kLlama);
  EXPECT_FALSE(llama3.tie_word_embeddings);
  EXPECT_EQ(llama3.head_dim, 16);
  EXPECT_EQ(llama3.rope_scaling, RopeScaling::kNone);
  EXPECT_DOUBLE_EQ(llama3.rope_theta, 500000.0);

  auto llama32 = ValueOrDie(LoadHfConfig(testing::FixturePath("models/llama32")));
  EXPECT_TRUE(llama32.tie_word_embeddings);
  EXPECT_EQ(llama32.rope_scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(llama32.rope_factor, 8.0);
  EXPECT_EQ(llama32.rope_original_max_positions, 64);

  auto qwen2 = ValueOrDie(LoadHfConfig(testing::FixturePath("models/qwen2")));
  EXPECT_EQ(qwen2.family, ModelFamily::kQwen2);
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.o_bias);

  auto qwen3 = ValueOrDie(LoadHfConfig(testing::FixturePath("models/qwen3")));
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim, 24);
  EXPECT_EQ(qwen3.q_dim(), 96);

  auto mistral = ValueOrDie(LoadHfConfig(testing::FixturePath("models/mistral")));
  EXPECT_EQ(mistral.family, ModelFamily::kMistral);
  ASSERT_TRUE(mistral.sliding_window.has_value());
  EXPECT_EQ(*mistral.sliding_window, 8);
}

TEST(HfConfig, ParamCountMatchesLlama3_8B) {
  auto cfg = ValueOrDie(ParseHfConfig(
      R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
          "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8})",
      "8b"));
  EXPECT_EQ(cfg.TotalParamCount(), 8030261248);  // Meta-Llama-3-8B
}

TEST(HfConfig, RefusesOtherArchitectures) {
  Status s = ParseError(R"({"model_type": "gpt2", "vocab_size": 10})");
  EXPECT_NE(s.message().find("model_type 'gpt2' is not supported"), std::string::npos) << s.message();
  EXPECT_NE(ParseError(R"({"vocab_size": 10})").message().find("model_type"), std::string::npos);
}

TEST(HfConfig, NamesTheBadField) {
  EXPECT_EQ(ParseError("{not json").code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ParseError("{not json").message().find("cfg.json: not valid JSON"), std::string::npos);
  EXPECT_NE(ParseError("[1, 2]").message().find("JSON object"), std::string::npos);
  // A number beyond a double's range is an error, not an escaping out_of_range exception (found by the fuzzer).
  EXPECT_NE(ParseError(R"({"vocab_size": 1e6905})").message().find("not valid JSON"), std::string::npos);
  auto missing = ParseError(R"({"model_type": "llama", "vocab_size": 100})");
  EXPECT_NE(missing.message().find("'hidden_size' is required"), std::string::npos) << missing.message();
  auto wrong_type = ParseError(Base(R"(, "rms_norm_eps": "small")"));
  EXPECT_NE(wrong_type.message().find("'rms_norm_eps' must be a number"), std::string::npos) << wrong_type.message();
  auto negative = ParseError(R"({"model_type": "llama", "vocab_size": -3})");
  EXPECT_NE(negative.message().find("'vocab_size' must be in [1, 16777216], got -3"), std::string::npos)
      << negative.message();
  auto gqa = ParseError(Base().replace(Base().find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3"));
  EXPECT_NE(gqa.message().find("num_key_value_heads"), std::string::npos) << gqa.message();
  auto act = ParseError(Base(R"(, "hidden_act": "gelu")"));
  EXPECT_NE(act.message().find("'hidden_act' 'gelu' is not supported"), std::string::npos) << act.message();
  auto rope = ParseError(Base(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})"));
  EXPECT_NE(rope.message().find("'rope_type' 'yarn' is not supported"), std::string::npos) << rope.message();
  auto llama3_rope = ParseError(Base(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})"));
  EXPECT_NE(llama3_rope.message().find("low_freq_factor"), std::string::npos) << llama3_rope.message();
}

// Dimensions beyond any model (num_hidden_layers 2^40 took the daemon down while it planned, vocab_size 2^63-1
// failed deep inside LibTorch without naming the file): each bounded here, naming the file and the field.
TEST(HfConfig, DimensionsBeyondAnyModelAreRefusedByField) {
  auto with = [](const std::string& key, const std::string& value) {
    std::string text = Base();
    const size_t at = text.find("\"" + key + "\": ");
    EXPECT_NE(at, std::string::npos) << key;
    const size_t end = text.find_first_of(",}", at);
    return ParseError(text.replace(at, end - at, "\"" + key + "\": " + value));
  };
  for (const auto& [key, value, bound] :
       {std::tuple<std::string, std::string, std::string>{"num_hidden_layers", "1099511627776", "[1, 1024]"},
        {"vocab_size", "9223372036854775807", "[1, 16777216]"},
        {"hidden_size", "4611686018427387904", "[1, 131072]"},
        {"intermediate_size", "1152921504606846976", "[1, 1048576]"},
        {"num_attention_heads", "1048576", "[1, 4096]"}}) {
    const Status s = with(key, value);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << key;
    EXPECT_NE(s.message().find("cfg.json: field '" + key + "' must be in " + bound + ", got " + value),
              std::string::npos)
        << s.message();
  }
  // At the bounds the parameter count stays exact (no int64 overflow anywhere in it).
  ModelConfig big = ValueOrDie(ParseHfConfig(R"({"model_type": "llama", "vocab_size": 16777216, "hidden_size": 131072,
      "intermediate_size": 1048576, "num_hidden_layers": 1024, "num_attention_heads": 4096, "head_dim": 4096})",
                                             "cfg.json"));
  EXPECT_GT(big.TotalParamCount(), 0);
  EXPECT_GT(big.TotalParamCount(), big.num_layers * big.LayerParamCount() - 1);
}

TEST(HfConfig, AcceptsTransformers5RopeParameters) {
  auto cfg = ValueOrDie(ParseHfConfig(
      Base(R"(, "rope_parameters": {"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0})"), "cfg.json"));
  EXPECT_EQ(cfg.rope_scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(cfg.rope_theta, 20000.0);
  EXPECT_DOUBLE_EQ(cfg.rope_factor, 2.0);
}

TEST(HfConfig, MissingFileIsNotFound) {
  auto r = LoadHfConfig("/nonexistent/model");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/model/config.json"), std::string::npos);
}

}  // namespace
}  // namespace slide
