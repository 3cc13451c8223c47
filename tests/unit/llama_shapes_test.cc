// The benchmarks' named shapes: the three Llama shapes' sizes, the @LAYERS depth of the largest-model ladder,
// and errors for names the benchmarks would otherwise have run as some other model.
#include "bench/llama_shapes.h"

#include <gtest/gtest.h>

#include "engine/model/param_layout.h"

namespace slide {
namespace {

int64_t Params(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& u : BuildModelLayout(c).units)
    for (const auto& p : u.params) n += p.numel;
  return n;
}

TEST(LlamaShape, NamedShapesHaveTheirModelsSizes) {
  EXPECT_NEAR(Params(bench::LlamaShape("llama-1b").value()) / 1e9, 1.236, 0.001);
  EXPECT_NEAR(Params(bench::LlamaShape("llama-3b").value()) / 1e9, 3.213, 0.001);
  EXPECT_NEAR(Params(bench::LlamaShape("llama-8b").value()) / 1e9, 8.030, 0.001);
}

TEST(LlamaShape, DepthSuffixKeepsTheLayerShapeAndChangesTheDepth) {
  const ModelConfig base = bench::LlamaShape("llama-8b").value();
  const ModelConfig deep = bench::LlamaShape("llama-8b@48").value();
  EXPECT_EQ(deep.num_layers, 48);
  EXPECT_EQ(deep.hidden_size, base.hidden_size);
  EXPECT_EQ(deep.intermediate_size, base.intermediate_size);
  EXPECT_EQ(deep.num_kv_heads, base.num_kv_heads);
  EXPECT_EQ(deep.tie_word_embeddings, base.tie_word_embeddings);
  // 16 more layers of 218.1M parameters each.
  EXPECT_NEAR((Params(deep) - Params(base)) / 16 / 1e6, 218.1, 0.1);
  EXPECT_EQ(bench::LlamaShape("tiny@2").value().num_layers, 2);
  // Llama-3-70B's shape: 70.55B parameters, as bench/shapes/llama-3-70b/config.json describes it.
  EXPECT_NEAR(Params(bench::LlamaShape("llama-70b").value()) / 1e9, 70.55, 0.01);
}

TEST(LlamaShape, UnknownNamesAndBadDepthsAreErrors) {
  for (const char* name :
       {"llama-405b", "", "llama-8b@", "llama-8b@0", "llama-8b@-4", "llama-8b@12x", "llama-8b@2000", "llama8b"}) {
    auto c = bench::LlamaShape(name);
    ASSERT_FALSE(c.ok()) << name;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(c.status().message().find(std::string("'") + name + "'"), std::string::npos) << c.status().ToString();
  }
}

}  // namespace
}  // namespace slide
