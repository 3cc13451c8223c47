// Tokenizer parity with Hugging Face `tokenizers` (fixtures from scripts/make_tokenizer_fixtures.py): exact ids
// with and without special tokens and the decoded text, for byte-level (Llama 3, Qwen2, GPT-2) and
// SentencePiece-style (Llama 2, Mistral) BPE; and precise errors for broken files and input.
#include "engine/data/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "engine/common/utf8.h"
#include "engine/data/special_tokens.h"
#include "tests/support/expect_contains.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

using testing::ExpectContains;

class TokenizerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerParity, MatchesHuggingFace) {
  const std::string dir = testing::FixturePath("tokenizers/" + GetParam());
  auto tok = testing::ValueOrDie(Tokenizer::FromFile(dir + "/tokenizer.json"));
  std::ifstream in(dir + "/expected.jsonl");
  std::string line;
  int cases = 0, mismatches = 0;
  while (std::getline(in, line)) {
    auto c = nlohmann::json::parse(line);
    const std::string text = c["text"];
    auto ids = testing::ValueOrDie(tok->Encode(text, true));
    auto plain = testing::ValueOrDie(tok->Encode(text, false));
    const bool ok = ids == c["ids"].get<std::vector<int32_t>>() && plain == c["ids_plain"].get<std::vector<int32_t>>();
    EXPECT_TRUE(ok) << GetParam() << " text: '" << text << "'\n ours:  " << nlohmann::json(ids).dump()
                    << "\n theirs: " << c["ids"].dump();
    EXPECT_EQ(tok->Decode(plain), c["decoded"].get<std::string>()) << GetParam() << " text: '" << text << "'";
    mismatches += !ok;
    ++cases;
  }
  EXPECT_GT(cases, 20);
  std::printf("TOKENIZER %-8s %d cases, %d id mismatches\n", GetParam().c_str(), cases, mismatches);
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerParity, ::testing::Values("llama3", "qwen2", "gpt2", "llama2", "mistral"),
                         [](const auto& info) { return info.param; });

TEST(Tokenizer, RejectsInvalidUtf8) {
  auto tok = testing::ValueOrDie(Tokenizer::FromFile(testing::FixturePath("tokenizers/llama3/tokenizer.json")));
  auto r = tok->Encode(std::string("ok \xC3\x28 bad"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "text is not valid UTF-8");
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));  // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));      // overlong
  EXPECT_TRUE(IsValidUtf8("Grüße 🦊"));
  EXPECT_EQ(Utf8Lossy("a\xFF\x80z"), "a\xEF\xBF\xBDz");  // a bad lead byte and its continuation bytes: one U+FFFD
}

// A number beyond a double's range fails the load with a status (it used to escape as out_of_range).
TEST(Tokenizer, NumberOverflowIsAnError) {
  auto tok = Tokenizer::FromJson(R"({"model": {"type": "BPE", "dropout": 1e999}})", "tok.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("tok.json: not valid JSON"), std::string::npos) << tok.status().message();
  // A token id that is a float, negative or beyond int32 is a malformed file, not undefined behaviour (found by the
  // fuzzer: an id of 2.2e48 was converted to int).
  for (const char* id : {"2.2e48", "1.5", "-3", "4294967296"}) {
    auto bad =
        Tokenizer::FromJson(std::string(R"({"model": {"type": "BPE", "vocab": {"a": )") + id + "}}}", "tok.json");
    ASSERT_FALSE(bad.ok()) << id;
    EXPECT_NE(bad.status().message().find("is not an integer in [0, 2^31)"), std::string::npos)
        << bad.status().message();
  }
  // A valid but huge id is refused before the id table is sized by it (found by the fuzzer: a 64 KiB file whose
  // ids reached tens of millions allocated 1.2 GB; at 2^31 - 1 it would be 64 GiB); sparse ids within bounds load.
  for (const char* id : {"2147483647", "262144"}) {
    auto huge = Tokenizer::FromJson(
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": )") + id + R"(}, "merges": []}})", "tok.json");
    ASSERT_FALSE(huge.ok()) << id;
    ExpectContains(huge.status().message(), std::string("tok.json: token 'b' has id ") + id +
                                                ", far beyond the vocabulary's 2 tokens (ids must be below 262144)");
  }
  auto sparse =
      Tokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 262143}, "merges": []}})", "tok.json");
  ASSERT_TRUE(sparse.ok()) << sparse.status().message();
  EXPECT_EQ((*sparse)->TokenId("b"), 262143);
  // A component missing a field its type requires is a malformed file (reading it was undefined behaviour: a
  // heap-buffer-overflow the fuzzer found in a TemplateProcessing without "single").
  for (const char* component :
       {R"("post_processor": {"type": "TemplateProcessing"})", R"("normalizer": {"type": "Sequence"})",
        R"("decoder": {"type": "Replace"})", R"("pre_tokenizer": {"type": "Split"})"}) {
    auto bad = Tokenizer::FromJson(std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, )") + component + "}",
                                   "tok.json");
    ASSERT_FALSE(bad.ok()) << component;
    EXPECT_NE(bad.status().message().find("tok.json: malformed tokenizer.json"), std::string::npos)
        << bad.status().message();
  }
}

TEST(Tokenizer, SpecialTokensAreKnown) {
  auto tok = testing::ValueOrDie(Tokenizer::FromFile(testing::FixturePath("tokenizers/qwen2/tokenizer.json")));
  const int32_t im_end = tok->TokenId("<|im_end|>");
  ASSERT_GE(im_end, 0);
  EXPECT_TRUE(tok->IsSpecial(im_end));
  auto ids = testing::ValueOrDie(tok->Encode("a<|im_end|>b"));
  EXPECT_EQ(tok->Decode(ids, /*skip_special_tokens=*/true), "ab");
  EXPECT_EQ(tok->Decode(ids), "a<|im_end|>b");
}

TEST(Tokenizer, BrokenFilesGetPreciseErrors) {
  auto missing = Tokenizer::FromFile("/nonexistent/tokenizer.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  ExpectContains(Tokenizer::FromJson("{", "t.json").status().message(), "t.json: not valid JSON");
  ExpectContains(Tokenizer::FromJson(R"({"model": {"type": "Unigram", "vocab": []}})", "t.json").status().message(),
                 "model type 'Unigram' is not supported");
  ExpectContains(Tokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})", "t.json")
                     .status()
                     .message(),
                 "merge 'a b' uses a token missing from the vocabulary");
  ExpectContains(Tokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                   "pre_tokenizer": {"type": "Whitespace"}})",
                                     "t.json")
                     .status()
                     .message(),
                 "pre-tokenizer 'Whitespace' is not supported");
  EXPECT_NE(Tokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                   "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"},
                                                     "behavior": "Isolated", "invert": false}})",
                                "t.json")
                .status()
                .message()
                .find("does not compile"),
            std::string::npos);
  ExpectContains(Tokenizer::FromJson(R"({"model": {"type": "BPE"}})", "t.json").status().message(), "malformed");
}

TEST(SpecialTokens, ReadTheWayTransformersDoes) {
  testing::TempDir dir;
  auto none = testing::ValueOrDie(LoadSpecialTokens(dir.path(), nullptr));  // absent files: nothing set
  EXPECT_EQ(none.bos_token, "");
  EXPECT_FALSE(none.add_bos_token.has_value());
  std::ofstream(dir.File("tokenizer_config.json"))
      << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
             "add_bos_token": false})";
  auto c = testing::ValueOrDie(LoadSpecialTokens(dir.path(), nullptr));
  EXPECT_EQ(c.bos_token, "<s>");
  EXPECT_EQ(c.eos_token, "</s>");
  EXPECT_EQ(c.pad_token, "");
  EXPECT_EQ(c.add_bos_token, std::optional<bool>(false));
  // special_tokens_map.json overrides the config where it names a token.
  std::ofstream(dir.File("special_tokens_map.json"))
      << R"({"eos_token": {"content": "<|im_end|>"}, "pad_token": "<pad>"})";
  auto m = testing::ValueOrDie(LoadSpecialTokens(dir.path(), nullptr));
  EXPECT_EQ(m.bos_token, "<s>");
  EXPECT_EQ(m.eos_token, "<|im_end|>");
  EXPECT_EQ(m.pad_token, "<pad>");
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  m.AddTo(vars);
  EXPECT_EQ(vars.dump(), R"({"bos_token":"<s>","eos_token":"<|im_end|>","pad_token":"<pad>"})");
  std::ofstream(dir.File("tokenizer_config.json")) << R"({"eos_token": 7})";
  auto bad = LoadSpecialTokens(dir.path(), nullptr);
  ASSERT_FALSE(bad.ok());
  ExpectContains(bad.status().message(), "field 'eos_token' must be a string");
  auto demo =
      testing::ValueOrDie(LoadSpecialTokens(std::string(SLIDE_FIXTURES_DIR) + "/../../deploy/demo/model", nullptr));
  EXPECT_EQ(demo.bos_token, "<|begin_of_text|>");
  EXPECT_EQ(demo.eos_token, "<|end_of_text|>");
}

TEST(SpecialTokens, EosFromGenerationConfigOnlyWhenTheTokenizerFilesNameNone) {
  testing::TempDir dir;
  auto tok =
      testing::ValueOrDie(Tokenizer::FromFile(std::string(SLIDE_FIXTURES_DIR) + "/tokenizers/llama3/tokenizer.json"));
  const int32_t eot = tok->TokenId("<|eot_id|>");
  ASSERT_GE(eot, 0);
  std::ofstream(dir.File("generation_config.json")) << "{\"eos_token_id\": [" << eot << ", 1]}";
  EXPECT_EQ(testing::ValueOrDie(LoadSpecialTokens(dir.path(), tok.get())).eos_token, "<|eot_id|>");
  std::ofstream(dir.File("tokenizer_config.json")) << R"({"eos_token": "<|end_of_text|>"})";
  EXPECT_EQ(testing::ValueOrDie(LoadSpecialTokens(dir.path(), tok.get())).eos_token, "<|end_of_text|>");
  std::ofstream(dir.File("tokenizer_config.json")) << "{}";
  std::ofstream(dir.File("generation_config.json")) << R"({"eos_token_id": 99999999})";
  ExpectContains(LoadSpecialTokens(dir.path(), tok.get()).status().message(), "outside the tokenizer's vocabulary");
}

}  // namespace
}  // namespace slide
