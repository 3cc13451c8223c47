// Dataset preparation throughput: LoadJsonlDataset (JSON, tokenizer, packing) over a JSONL file on one thread,
// the time between `interrupted` checks (how soon a cancel can take effect), and one JSON line.
// Usage: dataset_bench TOKENIZER_JSON DATASET_JSONL [SEQ_LEN=1024] [pack|truncate]
// bench/dataset_bench.sh builds a file with one 8 MiB line and one with the same text as ordinary lines.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/data/dataset.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: dataset_bench TOKENIZER_JSON DATASET_JSONL [SEQ_LEN=1024] [pack|truncate]\n");
    return 2;
  }
  auto tok = slide::Tokenizer::FromFile(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  slide::DatasetOptions o;
  o.seq_len = argc > 3 ? std::atoi(argv[3]) : 1024;
  o.mode = argc > 4 && std::string(argv[4]) == "truncate" ? slide::SequenceMode::kTruncate : slide::SequenceMode::kPack;
  using Clock = std::chrono::steady_clock;
  auto last = Clock::now();
  double longest_gap = 0;
  o.interrupted = [&] {
    const auto now = Clock::now();
    longest_gap = std::max(longest_gap, std::chrono::duration<double>(now - last).count());
    last = now;
    return slide::Status::Ok();
  };
  const auto t0 = Clock::now();
  auto ds = slide::LoadJsonlDataset(argv[2], **tok, o);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", ds.status().ToString().c_str());
    return 1;
  }
  longest_gap = std::max(longest_gap, std::chrono::duration<double>(Clock::now() - last).count());
  const nlohmann::json line = {{"bench", "dataset"},
                               {"file", argv[2]},
                               {"lines", ds->stats.lines},
                               {"tokens", ds->stats.tokens},
                               {"sequences", ds->train.size() + ds->eval.size()},
                               {"seq_len", o.seq_len},
                               {"mode", o.mode == slide::SequenceMode::kPack ? "pack" : "truncate"},
                               {"seconds", secs},
                               {"tokens_per_s", ds->stats.tokens / secs},
                               {"longest_seconds_between_interrupt_checks", longest_gap}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}
