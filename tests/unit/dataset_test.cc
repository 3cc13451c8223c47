// JSONL datasets: each format's tokens and loss masks, packing and padding, chat templates, the held-out
// split, the resumable order, and one precise error (file:line) per kind of bad input.
#include "engine/data/dataset.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "tests/support/expect_contains.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

using testing::ExpectContains;

using testing::TempDir;
using testing::ValueOrDie;

std::unique_ptr<Tokenizer> Load(const std::string& family) {
  return ValueOrDie(Tokenizer::FromFile(testing::FixturePath("tokenizers/" + family + "/tokenizer.json")));
}

std::string Write(const TempDir& dir, const std::string& content) {
  const std::string path = dir.File("data.jsonl");
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::vector<int32_t> Labeled(const Sequence& s) {
  std::vector<int32_t> out;
  for (int32_t l : s.labels)
    if (l != -100) out.push_back(l);
  return out;
}

TEST(Dataset, TextIsPackedIntoFullWindows) {
  auto tok = Load("llama3");
  TempDir dir;
  DatasetOptions o;
  o.seq_len = 16;
  o.special_tokens.bos_token = "<|begin_of_text|>";
  o.special_tokens.eos_token = "<|end_of_text|>";
  std::string content;
  for (int i = 0; i < 10; ++i)
    content += R"({"text": "The quick brown fox jumps over the lazy dog number )" + std::to_string(i) + "\"}\n";
  Dataset ds = ValueOrDie(LoadJsonlDataset(Write(dir, content), *tok, o));
  EXPECT_EQ(ds.stats.samples, 10);
  ASSERT_GE(ds.train.size(), 2u);
  int64_t total = 0;
  for (const auto& s : ds.train) {
    EXPECT_EQ(s.input_ids.size(), 16u);
    EXPECT_EQ(s.labels.size(), 16u);
    for (size_t t = 0; t < 16; ++t) {
      if (s.labels[t] != -100) {
        EXPECT_EQ(s.labels[t], s.input_ids[t]);
      }
    }
    total += static_cast<int64_t>(Labeled(s).size());
  }
  EXPECT_EQ(total, ds.stats.tokens - 10);  // every token trains except each sample's BOS; padding excluded
  EXPECT_EQ(ds.stats.loss_tokens, total);
  EXPECT_EQ(ds.train.front().input_ids.front(), tok->TokenId("<|begin_of_text|>"));
}

// One sample far longer than seq_len (an 8 MiB line took minutes: each cut sequence moved the whole rest of the
// stream) is cut into full windows in order, its tail padded.
TEST(Dataset, ALongSampleIsCutIntoWindowsInOrder) {
  auto tok = Load("llama3");
  TempDir dir;
  DatasetOptions o;
  o.seq_len = 8;
  o.format = DatasetFormat::kTokens;
  std::string ids;
  for (int i = 0; i < 1001; ++i) ids += (i ? ", " : "") + std::to_string(i % 500);
  Dataset ds = ValueOrDie(LoadJsonlDataset(Write(dir, "{\"input_ids\": [" + ids + "]}\n"), *tok, o));
  ASSERT_EQ(ds.train.size(), 126u);  // 125 full windows and the padded tail
  for (size_t w = 0; w < 125; ++w)
    for (size_t t = 0; t < 8; ++t) EXPECT_EQ(ds.train[w].input_ids[t], static_cast<int32_t>((w * 8 + t) % 500));
  EXPECT_EQ(ds.train.back().input_ids[0], 1000 % 500);
  EXPECT_EQ(ds.train.back().labels[1], -100);
}

// Preparation asks `interrupted` before every line, so a cancelled or suspended job stops reading within a line.
TEST(Dataset, InterruptedStopsTheLoadAtTheNextLine) {
  auto tok = Load("llama3");
  TempDir dir;
  std::string content;
  for (int i = 0; i < 100; ++i) content += R"({"text": "line )" + std::to_string(i) + "\"}\n";
  DatasetOptions o;
  o.seq_len = 16;
  int asked = 0;
  o.interrupted = [&]() { return ++asked > 5 ? Status(StatusCode::kCancelled, "stop") : Status::Ok(); };
  auto r = LoadJsonlDataset(Write(dir, content), *tok, o);
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(asked, 6);
}

std::shared_ptr<const ChatTemplate> Builtin(ChatTemplateChoice choice) {
  return ValueOrDie(ResolveChatTemplate(choice, ""));
}

TEST(Dataset, PromptCompletionTrainsOnTheCompletionOnly) {
  auto tok = Load("llama3");
  TempDir dir;
  DatasetOptions o;
  o.seq_len = 64;
  o.mode = SequenceMode::kTruncate;
  o.special_tokens.bos_token = "<|begin_of_text|>";
  o.special_tokens.eos_token = "<|end_of_text|>";
  Dataset ds = ValueOrDie(
      LoadJsonlDataset(Write(dir, R"({"prompt": "Question: two plus two?", "completion": " Four."})"), *tok, o));
  ASSERT_EQ(ds.train.size(), 1u);
  const Sequence& s = ds.train[0];
  EXPECT_EQ(s.input_ids.size(), 64u);
  auto completion = ValueOrDie(tok->Encode(" Four."));
  completion.push_back(tok->TokenId("<|end_of_text|>"));
  EXPECT_EQ(Labeled(s), completion);
  EXPECT_EQ(s.input_ids.back(), tok->TokenId("<|end_of_text|>"));  // padded with EOS by default
}

TEST(Dataset, Llama3ChatTrainsOnAssistantTurns) {
  auto tok = Load("llama3");
  TempDir dir;
  DatasetOptions o;
  o.seq_len = 128;
  o.mode = SequenceMode::kTruncate;
  o.chat_template = Builtin(ChatTemplateChoice::kLlama3);
  Dataset ds = ValueOrDie(LoadJsonlDataset(
      Write(dir,
            "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
            "{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello there.\"}, "
            "{\"role\": \"user\", \"content\": \"Bye\"}, {\"role\": \"assistant\", \"content\": \"Goodbye.\"}]}\n"),
      *tok, o));
  const Sequence& s = ds.train[0];
  EXPECT_EQ(tok->Decode(Labeled(s)), "Hello there.<|eot_id|>Goodbye.<|eot_id|>");
  std::vector<int32_t> ids(s.input_ids.begin(), s.input_ids.begin() + ds.stats.tokens);
  EXPECT_EQ(tok->Decode(ids),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
            "\n\nHello there.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nGoodbye.<|eot_id|>");
}

TEST(Dataset, ChatMLTrainsOnAssistantTurns) {
  auto tok = Load("qwen2");
  TempDir dir;
  DatasetOptions o;
  o.seq_len = 64;
  o.mode = SequenceMode::kTruncate;
  o.chat_template = Builtin(ChatTemplateChoice::kChatML);
  Dataset ds = ValueOrDie(LoadJsonlDataset(
      Write(dir, R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})"),
      *tok, o));
  // As TRL trains a reply: all the template adds after the generation prompt, the newline after <|im_end|> too.
  EXPECT_EQ(tok->Decode(Labeled(ds.train[0])), "Hello!<|im_end|>\n");
  // train_on: all trains every token of the rendering.
  o.train_on = TrainOn::kAll;
  Dataset all = ValueOrDie(LoadJsonlDataset(dir.File("data.jsonl"), *tok, o));
  EXPECT_EQ(tok->Decode(Labeled(all.train[0])),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n");
  // TRL's conversational prompt/completion (detected by its keys): the completion is trained, the prompt is not.
  o.train_on = TrainOn::kAssistant;
  Dataset pc = ValueOrDie(LoadJsonlDataset(
      Write(dir,
            R"({"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"},)"
            R"( {"role": "user", "content": "Again"}], "completion": [{"role": "assistant", "content": "Hello!"}]})"),
      *tok, o));
  EXPECT_EQ(tok->Decode(Labeled(pc.train[0])), "Hello!<|im_end|>\n");
  auto no_completion = LoadJsonlDataset(Write(dir, R"({"prompt": [{"role": "user", "content": "Hi"}]})"), *tok, o);
  ASSERT_FALSE(no_completion.ok());
  ExpectContains(no_completion.status().message(),
                 "data.jsonl:1: field 'completion' must be a non-empty list of messages, as 'prompt' is");
  Write(dir, R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})");
  // The built-in llama3 template writes tokens this tokenizer lacks.
  EXPECT_EQ(CheckChatTemplateTokens(ChatTemplateChoice::kLlama3, *tok).message(),
            "chat template llama3 needs token <|begin_of_text|>, which the tokenizer lacks");
  EXPECT_TRUE(CheckChatTemplateTokens(ChatTemplateChoice::kChatML, *tok).ok());
  // Without a template a messages line fails with the reason the caller gave.
  o.chat_template = nullptr;
  o.no_chat_template = "the model has no chat template";
  o.bad_lines = BadLinePolicy::kSkip;  // the job's configuration, not a bad line: the load fails all the same
  auto r = LoadJsonlDataset(dir.File("data.jsonl"), *tok, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  ExpectContains(r.status().message(), "data.jsonl:1: the model has no chat template");
}

TEST(Dataset, PreTokenizedKeepsLabels) {
  auto tok = Load("gpt2");
  TempDir dir;
  DatasetOptions o;
  o.seq_len = 8;
  o.mode = SequenceMode::kTruncate;
  Dataset ds = ValueOrDie(LoadJsonlDataset(Write(dir, R"({"input_ids": [5, 6, 7], "labels": [-100, 6, 7]})"), *tok, o));
  EXPECT_EQ(ds.train[0].labels, (std::vector<int32_t>{-100, 6, 7, -100, -100, -100, -100, -100}));
}

void ExpectError(const std::string& content, const std::string& part, DatasetOptions o = {}) {
  auto tok = Load("llama3");
  TempDir dir;
  o.seq_len = o.seq_len == 1024 ? 32 : o.seq_len;
  auto r = LoadJsonlDataset(Write(dir, content), *tok, o);
  ASSERT_FALSE(r.ok()) << content;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  ExpectContains(r.status().message(), part);
}

TEST(Dataset, BadInputIsReportedWithFileAndLine) {
  ExpectError("{\"text\": \"ok\"}\n{\"text\": \"broken\"\n", "data.jsonl:2: not valid JSON");
  ExpectError("{\"text\": \"ok\"}\n\n{\"prompt\": \"p\"}\n", "data.jsonl:3: missing field 'completion'");
  ExpectError("{\"text\": \"ok \xff\xfe\"}\n", "data.jsonl:1: not valid UTF-8");
  ExpectError("{\"text\": 5}\n", "data.jsonl:1: field 'text' must be a string");
  ExpectError("[1, 2]\n", "data.jsonl:1: a line must be a JSON object");
  ExpectError("{\"text\": 1e999}\n", "data.jsonl:1: not valid JSON");  // out_of_range, not a parse_error
  ExpectError("{\"input_ids\": [1, 99999]}\n", "data.jsonl:1: field 'input_ids' holds 99999, outside the vocabulary");
  DatasetOptions chat;
  chat.chat_template = Builtin(ChatTemplateChoice::kLlama3);
  ExpectError("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n", "has no assistant turn", chat);
  ExpectError("{\"messages\": [{\"role\": 7, \"content\": \"hi\"}]}\n", "messages[0] needs a string field 'role'",
              chat);
  ExpectError("", "no usable samples (0 lines, 0 skipped)");
  DatasetOptions strict;
  strict.seq_len = 4;
  strict.mode = SequenceMode::kTruncate;
  strict.long_samples = LongSamplePolicy::kFail;
  ExpectError("{\"text\": \"a rather long line of text that will not fit\"}\n", "data.jsonl:1: sample has", strict);
  DatasetOptions bos;
  bos.special_tokens.bos_token = "<nope>";
  ExpectError("{\"text\": \"x\"}\n", "bos_token '<nope>' is not in the tokenizer's vocabulary", bos);
}

TEST(Dataset, SkipPolicyCountsAndReports) {
  auto tok = Load("llama3");
  TempDir dir;
  DatasetOptions o;
  o.seq_len = 8;
  o.mode = SequenceMode::kTruncate;
  o.bad_lines = BadLinePolicy::kSkip;
  o.long_samples = LongSamplePolicy::kSkip;
  Dataset ds =
      ValueOrDie(LoadJsonlDataset(Write(dir,
                                        "{\"text\": \"fine\"}\nnot json\n{\"text\": \"also fine\"}\n{\"other\": 1}\n"
                                        "{\"text\": \"this one is far too long for eight tokens of context\"}\n"),
                                  *tok, o));
  EXPECT_EQ(ds.stats.lines, 5);
  EXPECT_EQ(ds.stats.samples, 2);
  EXPECT_EQ(ds.stats.skipped, 3);
  ASSERT_EQ(ds.stats.errors.size(), 2u);
  ExpectContains(ds.stats.errors[0], "data.jsonl:2: not valid JSON");
  ExpectContains(ds.stats.errors[1], "data.jsonl:4: no known field");
}

TEST(Dataset, HeldOutSplitIsSeeded) {
  auto tok = Load("llama3");
  TempDir dir;
  DatasetOptions o;
  o.seq_len = 8;
  o.mode = SequenceMode::kTruncate;
  o.eval_fraction = 0.25;
  o.seed = 7;
  std::string content;
  for (int i = 0; i < 20; ++i) content += "{\"text\": \"sample " + std::to_string(i) + "\"}\n";
  const std::string path = Write(dir, content);
  Dataset a = ValueOrDie(LoadJsonlDataset(path, *tok, o)), b = ValueOrDie(LoadJsonlDataset(path, *tok, o));
  EXPECT_EQ(a.eval.size(), 5u);
  EXPECT_EQ(a.train.size(), 15u);
  for (size_t k = 0; k < a.eval.size(); ++k) EXPECT_EQ(a.eval[k].input_ids, b.eval[k].input_ids);
}

TEST(BatchOrder, EveryEpochVisitsEachSequenceOnceAndResumesExactly) {
  BatchOrder order(10, 3);
  std::vector<int64_t> first;
  for (int b = 0; b < 5; ++b)
    for (int64_t i : order.Next(4)) first.push_back(i);  // 20 = two epochs
  std::set<int64_t> e0(first.begin(), first.begin() + 10), e1(first.begin() + 10, first.end());
  EXPECT_EQ(e0.size(), 10u);
  EXPECT_EQ(e1.size(), 10u);
  EXPECT_NE(std::vector<int64_t>(first.begin(), first.begin() + 10),
            std::vector<int64_t>(first.begin() + 10, first.end()));

  BatchOrder a(10, 3);
  a.Next(7);
  BatchOrder::Position saved = a.position();
  auto expect = a.Next(9);
  BatchOrder b(10, 3);
  b.Seek(saved);
  EXPECT_EQ(b.Next(9), expect);
}

}  // namespace
}  // namespace slide
