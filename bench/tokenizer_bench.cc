// Tokenizer throughput on one thread: encodes every line of a text file, checks the ids round-trip through
// decode, and prints one JSON line (MB/s, tokens/s). bench/tokenizer_bench.sh runs it beside PyPI tokenizers.
// Usage: tokenizer_bench TOKENIZER_JSON TEXT_FILE [REPEATS=3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "engine/data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench TOKENIZER_JSON TEXT_FILE [REPEATS]\n");
    return 2;
  }
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  auto tok = slide::Tokenizer::FromFile(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::ifstream in(argv[2]);
  std::vector<std::string> lines;
  size_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    bytes += line.size();
    lines.push_back(std::move(line));
  }
  size_t tokens = 0;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    tokens = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& l : lines) tokens += (*tok)->Encode(l).value().size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  int bad = 0;
  for (size_t i = 0; i < lines.size() && i < 200; ++i)
    bad += (*tok)->Decode((*tok)->Encode(lines[i]).value()) != lines[i];
  std::printf(
      "{\"bench\": \"tokenizer\", \"impl\": \"slideformer\", \"lines\": %zu, \"bytes\": %zu, \"tokens\": %zu, "
      "\"mb_per_s\": %.2f, \"tokens_per_s\": %.0f, \"roundtrip_failures_first200\": %d}\n",
      lines.size(), bytes, tokens, bytes / best / 1e6, tokens / best, bad);
  return 0;
}
