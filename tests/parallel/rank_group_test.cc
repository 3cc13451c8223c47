// RankGroup (engine/parallel/rank_group.h): its collectives' values with ranks as threads of one process (as the
// daemon's GPU ranks are), over Gloo on host tensors and NCCL on each GPU the box has; bad options refused.
#include "engine/parallel/rank_group.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/scratch_dir.h"

namespace slide {
namespace {

// Runs `body(group)` on `world` threads joined over a FileStore in `dir`; returns each rank's failure text ("" ok).
std::vector<std::string> OnThreads(const std::string& dir, int world, RankGroupOptions::Transport transport,
                                   const std::function<std::string(RankGroup&)>& body) {
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankGroupOptions o;
      o.transport = transport;
      o.rank = r;
      o.world = world;
      o.rendezvous = "file:" + dir + "/store";
      o.gloo_address = "127.0.0.1";
      o.timeout = std::chrono::seconds(60);
      auto group = RankGroup::Connect(o);
      failures[r] = group.ok() ? body(**group) : group.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  return failures;
}

// Rank r contributes (r + 1) * (1, 2, 3, ...): every result below is known in closed form.
std::string CheckCollectives(RankGroup& g, c10::Device device) {
  const int r = g.rank(), w = g.world();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const int64_t n = 5;
  const double ranks_sum = w * (w + 1) / 2.0;
  at::Tensor ramp = at::arange(1, w * n + 1, f32);  // (1 .. w n)

  at::Tensor sum = ramp * (r + 1);
  if (Status s = g.AllReduceSum(sum); !s.ok()) return s.ToString();
  if (!at::equal(sum, ramp * ranks_sum)) return "all-reduce: wrong values";

  at::Tensor mine = at::empty({n}, f32);
  if (Status s = g.ReduceScatterSum(ramp * (r + 1), mine); !s.ok()) return s.ToString();
  if (!at::equal(mine, ramp.narrow(0, r * n, n) * ranks_sum)) return "reduce-scatter: wrong values";

  at::Tensor all = at::empty({w * n}, f32.dtype(at::kBFloat16));
  if (Status s = g.AllGather(at::full({n}, r + 1, f32.dtype(at::kBFloat16)), all); !s.ok()) return s.ToString();
  for (int q = 0; q < w; ++q) {
    if (!at::equal(all.narrow(0, q * n, n), at::full({n}, q + 1, all.options()))) return "all-gather: wrong values";
  }
  at::Tensor short_out = mine.narrow(0, 0, n - 1);
  if (Status s = g.ReduceScatterSum(ramp, short_out); s.ok()) return "a mis-sized reduce-scatter ran";
  if (Status s = g.Barrier(); !s.ok()) return s.ToString();
  return "";
}

TEST(RankGroup, GlooCollectivesOverThreeThreads) {
  ScratchDir dir;
  const auto failures = OnThreads(dir.path(), 3, RankGroupOptions::Transport::kGloo,
                                  [](RankGroup& g) { return CheckCollectives(g, c10::Device(c10::kCPU)); });
  for (size_t r = 0; r < failures.size(); ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

TEST(RankGroup, RefusesBadOptionsNamingThem) {
  RankGroupOptions o;
  o.world = 2;
  o.rank = 2;
  o.rendezvous = "file:/tmp/x";
  auto bad_rank = RankGroup::Connect(o);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_rank.status().message().find("rank 2 of world 2"), std::string::npos);
  o.rank = 0;
  for (const char* where : {"", "nfs:/x", "tcp://host", "tcp://host:0", "tcp://host:70000", "tcp://host:12ab"}) {
    o.rendezvous = where;
    auto r = RankGroup::Connect(o);
    ASSERT_FALSE(r.ok()) << where;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << where;
  }
}

// Every GPU of the box as a rank on its own thread (one on a one-GPU box: the process group and its calls on
// device tensors; all of them on a multi-GPU kind).
TEST(RankGroup, NcclCollectivesOverEveryGpu_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine";
  ScratchDir dir;
  const int gpus = static_cast<int>(at::getNumGPUs());
  const auto failures = OnThreads(dir.path(), gpus, RankGroupOptions::Transport::kNccl, [](RankGroup& g) {
    return CheckCollectives(g, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(g.rank())));
  });
  for (size_t r = 0; r < failures.size(); ++r) EXPECT_EQ(failures[r], "") << "rank " << r << " of " << gpus;
}

}  // namespace
}  // namespace slide
