// Data parallelism on the CPU (issue 41's CI tests): 1, 2 and 4 rank processes (tests/parallel/dp_rank.cc) over
// c10d's Gloo on loopback, each running DataParallelReference, against the one-rank ReferenceTrainer on the same
// global batch; resuming onto another rank count from the gathered state; TCPStore and FileStore rendezvous giving
// the same bits; and a rank killed mid-step failing the others' step with a status.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/common/files.h"
#include "engine/parallel/rank_group.h"
#include "tests/parallel/dp_fixture.h"
#include "tests/support/scratch_dir.h"

extern char** environ;

namespace slide {
namespace {

struct Stats {
  int64_t step = 0, targets = 0;
  double loss = 0, grad_norm = 0, lr = 0;
};

std::vector<Stats> ReadStats(const std::string& path) {
  std::vector<Stats> out;
  std::ifstream in(path);
  Stats s;
  while (in >> s.step >> s.loss >> s.grad_norm >> s.lr >> s.targets) out.push_back(s);
  return out;
}

// A rank's stderr, for failure messages (the read's error where there is none).
std::string ReadText(const std::string& path) {
  auto text = ReadFileToString(path);
  return text.ok() ? *text : text.status().ToString();
}

struct Ranks {
  std::vector<int> exit_codes;  // -signal for a rank killed by one
  double seconds = 0;
};

// Starts `world` rank processes with `args` plus their rank's, each rank's stats in DIR/stats.R and stderr in
// DIR/err.R, and waits for all of them (killing what is left after `limit_s`).
Ranks RunRanks(const std::string& dir, int world, const std::vector<std::string>& args, int limit_s = 240) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> words = {SLIDE_DP_RANK_BIN,
                                      "--rank",
                                      std::to_string(r),
                                      "--world",
                                      std::to_string(world),
                                      "--stats-out",
                                      dir + "/stats." + std::to_string(r)};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t io;
    posix_spawn_file_actions_init(&io);
    const std::string err = dir + "/err." + std::to_string(r);
    posix_spawn_file_actions_addopen(&io, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &io, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&io);
    pids.push_back(pid);
  }
  Ranks out;
  out.exit_codes.assign(world, -1000);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (out.exit_codes[r] != -1000) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        out.exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(limit_s)) {
      for (int r = 0; r < world; ++r) {
        if (out.exit_codes[r] == -1000) kill(pids[r], SIGKILL);
      }
      ADD_FAILURE() << "ranks still running after " << limit_s << " s";
      limit_s = 1 << 30;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

void ExpectAllZero(const Ranks& ranks, const std::string& dir) {
  for (size_t r = 0; r < ranks.exit_codes.size(); ++r) {
    EXPECT_EQ(ranks.exit_codes[r], 0) << "rank " << r << ": " << ReadText(dir + "/err." + std::to_string(r));
  }
}

// The one-rank reference over steps [0, steps).
struct Reference {
  std::vector<StepStats> stats;
  ModelParams master;
};
Reference RunReference(int64_t steps, OptimizerKind optimizer) {
  const ModelConfig cfg = dp_fixture::Config();
  ReferenceTrainer trainer(cfg, dp_fixture::Start(cfg).master, dp_fixture::Options(optimizer));
  Reference out;
  for (int64_t s = 0; s < steps; ++s) out.stats.push_back(trainer.Step(dp_fixture::Batch(s, cfg.vocab_size)));
  out.master = trainer.master();
  return out;
}

// Largest difference of the ranks' weight updates from the reference's, per parameter, relative to the reference's
// largest update in that parameter (as the HF trajectory tests measure it: where a gradient sits at rounding noise
// Adam turns the noise into whole steps of either sign, so the bound is relative to the tensor's updates).
double WorstUpdateDifference(const ModelParams& ours, const ModelParams& reference) {
  const ModelParams start = dp_fixture::Start(dp_fixture::Config()).master;
  auto a = ours.Named(), b = reference.Named(), s = start.Named();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    at::Tensor ref_update = b[i].second - s[i].second;
    const double scale = ref_update.abs().max().item<double>();
    const double diff = (a[i].second - b[i].second).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(scale, 1e-30));
  }
  return worst;
}

bool BitEqual(const ModelParams& a, const ModelParams& b) {
  for (size_t u = 0; u < a.units.size(); ++u) {
    if (!at::equal(a.units[u], b.units[u])) return false;
  }
  return true;
}

ModelParams ReadMaster(const std::string& path) {
  TrainerState s;
  EXPECT_TRUE(dp_fixture::ReadState(path, dp_fixture::Config(), s)) << path;
  return s.master;
}

TEST(DataParallel, OneRankOverGlooIsTheReferenceBitForBit) {
  ScratchDir dir;
  const Ranks ranks =
      RunRanks(dir.path(), 1,
               {"--rendezvous", "file:" + dir.path() + "/store", "--to", "3", "--state-out", dir.path() + "/state"});
  ExpectAllZero(ranks, dir.path());
  const Reference ref = RunReference(3, OptimizerKind::kAdamW);
  const auto stats = ReadStats(dir.path() + "/stats.0");
  ASSERT_EQ(stats.size(), 3u);
  for (size_t s = 0; s < stats.size(); ++s) {
    EXPECT_EQ(stats[s].loss, ref.stats[s].loss) << "step " << s;
    EXPECT_EQ(stats[s].grad_norm, ref.stats[s].grad_norm) << "step " << s;
    EXPECT_EQ(stats[s].targets, ref.stats[s].valid_targets);
  }
  EXPECT_TRUE(BitEqual(ReadMaster(dir.path() + "/state"), ref.master));
}

class DataParallelWorld : public ::testing::TestWithParam<int> {};

// Every rank reports the global step's stats; they equal the reference's within fp32 rounding (the ranks sum their
// rows' gradients in another order), and so do the weights after four steps with clipping active.
TEST_P(DataParallelWorld, EqualsTheOneRankReferenceOnTheSameGlobalBatch) {
  const int world = GetParam();
  ScratchDir dir;
  const Ranks ranks =
      RunRanks(dir.path(), world,
               {"--rendezvous", "file:" + dir.path() + "/store", "--to", "4", "--state-out", dir.path() + "/state"});
  ExpectAllZero(ranks, dir.path());
  const Reference ref = RunReference(4, OptimizerKind::kAdamW);
  for (const StepStats& st : ref.stats) EXPECT_GT(st.grad_norm, 0.5) << "the fixture should clip (max_grad_norm 0.5)";
  for (int r = 0; r < world; ++r) {
    const auto stats = ReadStats(dir.path() + "/stats." + std::to_string(r));
    ASSERT_EQ(stats.size(), 4u) << "rank " << r;
    for (size_t s = 0; s < stats.size(); ++s) {
      EXPECT_NEAR(stats[s].loss, ref.stats[s].loss, 1e-6 * ref.stats[s].loss) << "rank " << r << " step " << s;
      EXPECT_NEAR(stats[s].grad_norm, ref.stats[s].grad_norm, 1e-5 * ref.stats[s].grad_norm) << "step " << s;
      EXPECT_EQ(stats[s].targets, ref.stats[s].valid_targets);
    }
  }
  const double worst = WorstUpdateDifference(ReadMaster(dir.path() + "/state"), ref.master);
  std::printf("DP world %d: worst weight-update difference %.2e of the tensor's largest update, %.1f s\n", world, worst,
              ranks.seconds);
  EXPECT_LT(worst, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DataParallelWorld, ::testing::Values(2, 4));

// Two ranks train two steps; their gathered state resumes on four ranks (re-sharded: each slices its ranges) for
// two more; the weights equal four reference steps as the uninterrupted runs do. And back from four to one.
TEST(DataParallel, ResumesOntoAnotherRankCount) {
  ScratchDir dir;
  const std::string d = dir.path();
  ExpectAllZero(RunRanks(d, 2, {"--rendezvous", "file:" + d + "/s1", "--to", "2", "--state-out", d + "/half"}), d);
  ExpectAllZero(RunRanks(d, 4,
                         {"--rendezvous", "file:" + d + "/s2", "--from", "2", "--to", "4", "--state-in", d + "/half",
                          "--state-out", d + "/four"}),
                d);
  const auto stats = ReadStats(d + "/stats.3");
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].step, 3);  // the step count travels with the state
  const Reference ref = RunReference(4, OptimizerKind::kAdamW);
  EXPECT_NEAR(stats[1].loss, ref.stats[3].loss, 1e-6 * ref.stats[3].loss);
  EXPECT_LT(WorstUpdateDifference(ReadMaster(d + "/four"), ref.master), 1e-3);

  ExpectAllZero(RunRanks(d, 1,
                         {"--rendezvous", "file:" + d + "/s3", "--from", "2", "--to", "4", "--state-in", d + "/half",
                          "--state-out", d + "/one"}),
                d);
  EXPECT_LT(WorstUpdateDifference(ReadMaster(d + "/one"), ref.master), 1e-3);
}

// The across-hosts rendezvous (a TCPStore, here served by this process on a port the kernel picks) gives the same
// bits as a FileStore: with the same rank count the reduction order is fixed.
TEST(DataParallel, TcpStoreRendezvousGivesTheFileStoreBits) {
  ScratchDir dir;
  const std::string d = dir.path();
  c10d::TCPStoreOptions server;
  server.port = 0;
  server.isServer = true;
  server.waitWorkers = false;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server);
  const std::string address = "tcp://127.0.0.1:" + std::to_string(store->getPort());
  ExpectAllZero(
      RunRanks(d, 2, {"--rendezvous", address, "--store", "external", "--to", "2", "--state-out", d + "/tcp"}), d);
  ExpectAllZero(RunRanks(d, 2, {"--rendezvous", "file:" + d + "/store", "--to", "2", "--state-out", d + "/file"}), d);
  EXPECT_TRUE(BitEqual(ReadMaster(d + "/tcp"), ReadMaster(d + "/file")));
}

// 8-bit moments over two ranks: each shard quantises its blocks as the whole unit does (ShardLayout), so the run
// follows the one-rank 8-bit reference. Not to fp32 rounding: a gradient that differs in its last bits can move a
// moment across a code boundary of the 8-bit map, a step of up to a few percent of the block's largest moment
// (1.7e-2 of the largest update measured here; fp32 moments give 1.7e-4).
TEST(DataParallel, EightBitMomentsOverTwoRanksFollowTheReference) {
  ScratchDir dir;
  const std::string d = dir.path();
  ExpectAllZero(RunRanks(d, 2,
                         {"--rendezvous", "file:" + d + "/store", "--to", "4", "--optimizer", "adamw_8bit",
                          "--state-out", d + "/state"}),
                d);
  const Reference ref = RunReference(4, OptimizerKind::kAdamW8bit);
  const auto stats = ReadStats(d + "/stats.1");
  ASSERT_EQ(stats.size(), 4u);
  for (size_t s = 0; s < stats.size(); ++s) {
    EXPECT_NEAR(stats[s].loss, ref.stats[s].loss, 1e-5 * ref.stats[s].loss) << "step " << s;
  }
  const double worst = WorstUpdateDifference(ReadMaster(d + "/state"), ref.master);
  std::printf("DP 8-bit world 2: worst weight-update difference %.2e\n", worst);
  EXPECT_LT(worst, 5e-2);
}

// Rank 1 is killed as step 1 begins: rank 0's step fails with the group's error within its timeout (not a hang, not
// a crash), so the job that owns it can fail cleanly.
TEST(DataParallel, ARankKilledMidRunFailsTheOthersStepWithAStatus) {
  ScratchDir dir;
  const std::string d = dir.path();
  const Ranks ranks = RunRanks(
      d, 2,
      {"--rendezvous", "file:" + d + "/store", "--to", "3", "--die-at", "1", "--die-rank", "1", "--timeout-s", "15"},
      120);
  ASSERT_EQ(ranks.exit_codes.size(), 2u);
  EXPECT_EQ(ranks.exit_codes[1], -SIGKILL);
  EXPECT_EQ(ranks.exit_codes[0], 3) << ReadText(d + "/err.0");
  const std::string err = ReadText(d + "/err.0");
  EXPECT_NE(err.find("rank group"), std::string::npos) << err;
  EXPECT_NE(err.find("step 1"), std::string::npos) << err;
  EXPECT_EQ(ReadStats(d + "/stats.0").size(), 1u);  // step 0 completed before the loss
  EXPECT_LT(ranks.seconds, 90);
}

// Every GPU of the box as a rank on its own thread over NCCL (one on a one-GPU box: the NCCL path of each collective
// the step makes; all of them on a multi-GPU kind), fp32 compute, against the reference on the first GPU.
TEST(DataParallel, EveryGpuAsARankThreadFollowsTheReference_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine";
  ScratchDir dir;
  const int gpus = static_cast<int>(at::getNumGPUs());
  const ModelConfig cfg = dp_fixture::Config();
  const TrainerState start = dp_fixture::Start(cfg);
  std::vector<std::vector<StepStats>> stats(gpus);
  std::vector<std::string> failures(gpus);
  ModelParams gathered;
  std::vector<std::thread> threads;
  for (int r = 0; r < gpus; ++r) {
    threads.emplace_back([&, r] {
      RankGroupOptions o;
      o.transport = RankGroupOptions::Transport::kNccl;
      o.rank = r;
      o.world = gpus;
      o.rendezvous = "file:" + dir.path() + "/store";
      auto group = RankGroup::Connect(o);
      if (!group.ok()) {
        failures[r] = group.status().ToString();
        return;
      }
      TrainerOptions options = dp_fixture::Options(OptimizerKind::kAdamW);
      options.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(r));
      DataParallelReference trainer(cfg, start, options, **group);
      for (int64_t s = 0; s < 4; ++s) {
        auto st = trainer.Step(dp_fixture::Batch(s, cfg.vocab_size));
        if (!st.ok()) {
          failures[r] = st.status().ToString();
          return;
        }
        stats[r].push_back(*st);
      }
      auto state = trainer.Gather();
      if (!state.ok()) failures[r] = state.status().ToString();
      if (r == 0 && state.ok()) gathered = state->master.To(at::TensorOptions().dtype(at::kFloat).device(at::kCPU));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < gpus; ++r) ASSERT_EQ(failures[r], "") << "rank " << r << " of " << gpus;

  TrainerOptions options = dp_fixture::Options(OptimizerKind::kAdamW);
  options.device = c10::Device(c10::kCUDA, 0);
  ReferenceTrainer reference(cfg, start.master, options);
  for (int64_t s = 0; s < 4; ++s) {
    const StepStats ref = reference.Step(dp_fixture::Batch(s, cfg.vocab_size));
    for (int r = 0; r < gpus; ++r) {
      EXPECT_NEAR(stats[r][s].loss, ref.loss, 1e-5 * ref.loss) << "rank " << r << " step " << s;
      EXPECT_NEAR(stats[r][s].grad_norm, ref.grad_norm, 1e-4 * ref.grad_norm) << "rank " << r << " step " << s;
    }
  }
  const double worst =
      WorstUpdateDifference(gathered, reference.master().To(at::TensorOptions().dtype(at::kFloat).device(at::kCPU)));
  std::printf("DP NCCL over %d GPU(s): worst weight-update difference %.2e\n", gpus, worst);
  EXPECT_LT(worst, 1e-2);
}

}  // namespace
}  // namespace slide
