// One rank of the data-parallel tests (tests/parallel/data_parallel_test.cc starts 2 or 4 of them): joins the
// group, runs steps [--from, --to) of the fixture's training (dp_fixture.h) with DataParallelReference, writes each
// step's stats and, from rank 0, the gathered state. --die-at STEP --die-rank R: rank R kills itself as that step
// begins (a rank lost mid-run); the others must fail that step with a status, not hang or crash. Exit codes: 0 done, 2
// bad arguments, 3 a status error (its message on stderr), 4 the state file could not be written or read.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>

#include "engine/parallel/data_parallel_reference.h"
#include "engine/parallel/rank_group.h"
#include "tests/parallel/dp_fixture.h"

int main(int argc, char** argv) {
  using namespace slide;
  RankGroupOptions group;
  int64_t from = 0, to = 1, die_at = -1, die_rank = -1, timeout_s = 60;
  std::string optimizer = "adamw", state_in, state_out, stats_out, store_role = "rank0";
  CLI::App app{"one rank of the data-parallel tests"};
  app.add_option("--rank", group.rank)->required();
  app.add_option("--world", group.world)->required();
  app.add_option("--rendezvous", group.rendezvous)->required();
  app.add_option("--store", store_role, "tcp://: rank0 serves the store, or external")
      ->check(CLI::IsMember({"rank0", "external"}));
  app.add_option("--from", from);
  app.add_option("--to", to);
  app.add_option("--optimizer", optimizer)->check(CLI::IsMember({"adamw", "adamw_8bit"}));
  app.add_option("--state-in", state_in, "start from this gathered state (else the fixture's start)");
  app.add_option("--state-out", state_out, "rank 0 writes the gathered state here");
  app.add_option("--stats-out", stats_out)->required();
  app.add_option("--die-at", die_at, "the step as which --die-rank kills itself");
  app.add_option("--die-rank", die_rank);
  app.add_option("--timeout-s", timeout_s);
  CLI11_PARSE(app, argc, argv);
  group.rank_zero_serves_store = store_role == "rank0";
  group.gloo_address = "127.0.0.1";
  group.timeout = std::chrono::seconds(timeout_s);

  const ModelConfig cfg = dp_fixture::Config();
  TrainerState start;
  if (state_in.empty()) {
    start = dp_fixture::Start(cfg);
  } else if (!dp_fixture::ReadState(state_in, cfg, start)) {
    std::fprintf(stderr, "rank %d: cannot read %s\n", group.rank, state_in.c_str());
    return 4;
  }
  auto joined = RankGroup::Connect(group);
  if (!joined.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", group.rank, joined.status().ToString().c_str());
    return 3;
  }
  RankGroup& ranks = **joined;
  const OptimizerKind kind = optimizer == "adamw" ? OptimizerKind::kAdamW : OptimizerKind::kAdamW8bit;
  DataParallelReference trainer(cfg, start, dp_fixture::Options(kind), ranks);
  FILE* stats = std::fopen(stats_out.c_str(), "w");
  if (!stats) return 4;
  for (int64_t s = from; s < to; ++s) {
    if (s == die_at && group.rank == die_rank) ::kill(::getpid(), SIGKILL);
    auto st = trainer.Step(dp_fixture::Batch(s, cfg.vocab_size));
    if (!st.ok()) {
      std::fprintf(stderr, "rank %d step %lld: %s\n", group.rank, static_cast<long long>(s),
                   st.status().ToString().c_str());
      std::fclose(stats);
      return 3;
    }
    std::fprintf(stats, "%lld %.17g %.17g %.17g %lld\n", static_cast<long long>(st->step), st->loss, st->grad_norm,
                 st->lr, static_cast<long long>(st->valid_targets));
  }
  std::fclose(stats);
  if (!state_out.empty()) {
    auto gathered = trainer.Gather();
    if (!gathered.ok()) {
      std::fprintf(stderr, "rank %d gather: %s\n", group.rank, gathered.status().ToString().c_str());
      return 3;
    }
    if (group.rank == 0 && !state_out.empty() && !dp_fixture::WriteState(state_out, *gathered)) return 4;
  }
  return 0;
}
