// The optimizer state's NVMe tier: updates walk each unit chunk by chunk through a small ring (units larger than
// the ring, odd sizes, several steps) and the files hold exactly what an in-memory copy of the same updates holds;
// fresh moments read as zero; a tiered master round-trips; updates out of the scheduled order are refused; an I/O
// error is returned by that update and every later one; a disk that cannot hold the tier fails Open.
#include "engine/io/state_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

#include "tests/support/scratch_dir.h"

namespace slide {
namespace {

StateTierOptions SmallRing(const std::string& dir, const std::string& backend, TierMode mode, int buffers) {
  StateTierOptions o;
  o.mode = mode;
  o.io.dirs = {dir};
  o.io.backend = backend;
  o.io.request_bytes = 8192;
  o.chunk_bytes = 4096;  // 1024 floats per array per chunk: most units span several chunks
  o.buffers = buffers;
  return o;
}

TEST(StateTier, UpdatesThroughTheRingEqualTheSameUpdatesInMemory) {
  const std::vector<int64_t> numel = {1, 1023, 1024, 5000, 0, 3073};
  for (const std::string& backend : Backends())
    for (TierMode mode : {TierMode::kMoments, TierMode::kMomentsAndMaster})
      for (int buffers : {2, 3, 8}) {
        ScratchDir dir;
        auto opened = StateTier::Open(SmallRing(dir.path(), backend, mode, buffers), numel);
        ASSERT_TRUE(opened.ok()) << opened.status().ToString();
        StateTier& tier = **opened;
        const int arrays = tier.arrays();
        ASSERT_EQ(arrays, mode == TierMode::kMoments ? 2 : 3);
        // want[a][u]: what array a of unit u must hold.
        std::vector<std::vector<std::vector<float>>> want(3);
        std::mt19937 rng(7);
        for (int a = 0; a < 3; ++a)
          for (int64_t n : numel) want[a].emplace_back(n, 0.0f);
        if (tier.holds_master())
          for (size_t u = 0; u < numel.size(); ++u) {
            for (auto& x : want[kMasterArray][u]) x = static_cast<float>(rng() % 1000) / 7.0f;
            ASSERT_TRUE(tier.WriteArray(u, kMasterArray, want[kMasterArray][u].data()).ok());
          }
        for (int step = 1; step <= 3; ++step) {
          // Forward order one step, reverse the next: the schedule, not the unit numbers, decides the order.
          std::vector<size_t> order;
          for (size_t u = 0; u < numel.size(); ++u) order.push_back(step % 2 ? u : numel.size() - 1 - u);
          for (size_t u : order) tier.Schedule(u);
          for (size_t u : order) {
            Status st = tier.Update(u, [&](const StateTier::Chunk& c) {
              for (int64_t i = 0; i < c.n; ++i) {
                const float g = static_cast<float>((c.begin + i) % 13) + step;
                c.array[kExpAvg][i] = 0.5f * c.array[kExpAvg][i] + g;
                c.array[kExpAvgSq][i] = c.array[kExpAvgSq][i] + g * g;
                if (c.array[kMasterArray] != nullptr) c.array[kMasterArray][i] -= 0.25f * c.array[kExpAvg][i];
              }
            });
            ASSERT_TRUE(st.ok()) << st.ToString();
            for (int64_t i = 0; i < numel[u]; ++i) {
              const float g = static_cast<float>(i % 13) + step;
              want[kExpAvg][u][i] = 0.5f * want[kExpAvg][u][i] + g;
              want[kExpAvgSq][u][i] += g * g;
              want[kMasterArray][u][i] -= 0.25f * want[kExpAvg][u][i];
            }
          }
        }
        ASSERT_TRUE(tier.Flush().ok());
        for (int a = 0; a < arrays; ++a)
          for (size_t u = 0; u < numel.size(); ++u) {
            std::vector<float> got(numel[u], -1.0f);
            ASSERT_TRUE(tier.ReadArray(u, static_cast<StateArray>(a), got.data()).ok());
            EXPECT_EQ(got, want[a][u]) << backend << " mode " << TierModeName(mode) << " buffers " << buffers
                                       << " array " << a << " unit " << u;
          }
        EXPECT_GT(tier.store().bytes_written(), 0);
      }
}

TEST(StateTier, FreshMomentsReadAsZeroAndFilesAreRemovedOnClose) {
  ScratchDir dir;
  {
    auto tier = StateTier::Open(SmallRing(dir.path(), "pread", TierMode::kMoments, 2), {3000, 17});
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    EXPECT_EQ(dir.Files().size(), 2u);
    std::vector<float> got(3000, 1.0f);
    ASSERT_TRUE((*tier)->ReadArray(0, kExpAvgSq, got.data()).ok());
    EXPECT_EQ(got, std::vector<float>(3000, 0.0f));
    Status no_master = (*tier)->ReadArray(0, kMasterArray, got.data());
    EXPECT_EQ(no_master.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*tier)->ReadArray(2, kExpAvg, got.data()).code(), StatusCode::kInvalidArgument);  // no unit 2
    EXPECT_EQ((*tier)->WriteArray(2, kExpAvg, got.data()).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(dir.Files().empty());
}

TEST(StateTier, UpdatesOutOfTheScheduledOrderAreRefused) {
  ScratchDir dir;
  auto tier = StateTier::Open(SmallRing(dir.path(), "pread", TierMode::kMoments, 3), {100, 100});
  ASSERT_TRUE(tier.ok());
  auto nothing = [](const StateTier::Chunk&) {};
  Status unscheduled = (*tier)->Update(0, nothing);
  EXPECT_EQ(unscheduled.code(), StatusCode::kInternal);
  EXPECT_NE(unscheduled.message().find("without being scheduled"), std::string::npos) << unscheduled.ToString();
  (*tier)->Schedule(0);
  (*tier)->Schedule(1);
  Status swapped = (*tier)->Update(1, nothing);
  EXPECT_NE(swapped.message().find("out of the scheduled order"), std::string::npos) << swapped.ToString();
}

TEST(StateTier, AnIoErrorFailsThatUpdateAndEveryLaterOne) {
  for (const std::string& backend : Backends()) {
    ScratchDir dir;
    auto tier = StateTier::Open(SmallRing(dir.path(), backend, TierMode::kMoments, 2), {4096, 4096});
    ASSERT_TRUE(tier.ok());
    // Unit 0's file is cut behind the tier's back: its reads reach the end of the file.
    std::vector<std::string> files = dir.Files();
    ASSERT_EQ(files.size(), 2u);
    for (const auto& f : files) {
      if (f.find("unit-00000") != std::string::npos) {
        ASSERT_EQ(::truncate(f.c_str(), 4096), 0);
      }
    }
    (*tier)->Schedule(0);
    (*tier)->Schedule(1);
    int calls = 0;
    Status first = (*tier)->Update(0, [&](const StateTier::Chunk&) { ++calls; });
    EXPECT_EQ(first.code(), StatusCode::kDataLoss) << backend << ": " << first.ToString();
    Status later = (*tier)->Update(1, [&](const StateTier::Chunk&) { ++calls; });
    EXPECT_EQ(later.code(), StatusCode::kDataLoss) << later.ToString();
    EXPECT_EQ(calls, 0);  // no update ran on state that was not read
    EXPECT_EQ((*tier)->Flush().code(), StatusCode::kDataLoss);
  }
}

TEST(StateTier, BadOptionsAreRefused) {
  ScratchDir dir;
  StateTierOptions o = SmallRing(dir.path(), "pread", TierMode::kMoments, 2);
  o.chunk_bytes = 1000;
  EXPECT_EQ(StateTier::Open(o, {10}).status().code(), StatusCode::kInvalidArgument);
  o = SmallRing(dir.path(), "pread", TierMode::kMoments, 1);
  EXPECT_EQ(StateTier::Open(o, {10}).status().code(), StatusCode::kInvalidArgument);
  o = SmallRing(dir.path(), "pread", TierMode::kNone, 2);
  EXPECT_EQ(StateTier::Open(o, {10}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTierMode("moment").status().code(), StatusCode::kInvalidArgument);
  auto parsed = ParseTierMode("moments_and_master");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, TierMode::kMomentsAndMaster);
}

}  // namespace
}  // namespace slide
