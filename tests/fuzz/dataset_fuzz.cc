// JSONL dataset lines (text, prompt/completion, messages, tokens; auto-detected) through the demo tokenizer, with
// the skip policy: a bad line is counted and skipped, never a crash; every sequence is seq_len long.
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
  const std::string& path = slide::fuzz::WriteInput(data, size, ".jsonl");
  for (auto mode : {slide::SequenceMode::kPack, slide::SequenceMode::kTruncate}) {
    slide::DatasetOptions o;
    o.seq_len = 16;
    o.mode = mode;
    o.bad_lines = slide::BadLinePolicy::kSkip;
    o.eos_token = "<|end_of_text|>";
    auto ds = slide::LoadJsonlDataset(path, *tok, o);
    if (!ds.ok()) continue;
    for (const auto& s : ds->train)
      if (s.input_ids.size() != 16 || s.labels.size() != 16) std::abort();
  }
  return 0;
}
