// JSONL dataset lines (text, prompt/completion, messages, tokens; auto-detected) through the demo tokenizer, with
// the skip policy: a bad line is counted and skipped, never a crash; every sequence is seq_len long. The input's
// first byte picks the mode by its low bit (seeds start with 0: pack, or 1: truncate; one load per execution), the
// rest is the file.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/data/dataset.h"
#include "engine/data/tokenizer.h"
#include "tests/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<slide::Tokenizer> tok =
      std::move(slide::Tokenizer::FromFile(std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/model/tokenizer.json"))
          .value();
  if (size == 0) return 0;
  slide::DatasetOptions o;
  o.seq_len = 16;
  o.mode = (data[0] & 1) != 0 ? slide::SequenceMode::kTruncate : slide::SequenceMode::kPack;
  o.bad_lines = slide::BadLinePolicy::kSkip;
  o.special_tokens.eos_token = "<|end_of_text|>";
  // messages lines through the Jinja engine (the built-in llama3 template).
  static const std::shared_ptr<const slide::ChatTemplate> llama3 =
      std::move(slide::ResolveChatTemplate(slide::ChatTemplateChoice::kLlama3, "")).value();
  o.chat_template = llama3;
  auto ds = slide::LoadJsonlDataset(slide::fuzz::WriteInput(data + 1, size - 1, ".jsonl"), *tok, o);
  if (!ds.ok()) return 0;
  for (const auto& s : ds->train)
    if (s.input_ids.size() != 16 || s.labels.size() != 16) std::abort();
  return 0;
}
