#include "engine/common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace slide {
namespace {

TEST(ThreadPool, RunsEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, ConcurrentCallersAreServedInTurn) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) pool.ParallelFor(100, [&](int64_t i) { total.fetch_add(i); });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 4950);
}

// Back-to-back calls of a few indices each: a worker still leaving one call must neither run an index of the next
// call with the last call's function nor count toward the next call's completion (which would return it early,
// run an index twice or never return).
TEST(ThreadPool, BackToBackCallsNeverMixTheirWork) {
  ThreadPool pool(8);
  std::atomic<int64_t> late{0};  // runs of a call's function after that call returned
  for (int call = 0; call < 20000; ++call) {
    const int64_t n = 2 + call % 5;
    std::vector<std::atomic<int>> hits(n);
    std::atomic<bool> returned{false};
    pool.ParallelFor(n, [&](int64_t i) {
      if (returned.load()) late.fetch_add(1);
      std::this_thread::yield();  // let the workers join in
      hits[i].fetch_add(1);
    });
    returned.store(true);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "call " << call << " index " << i;
  }
  EXPECT_EQ(late.load(), 0);
}

// An index that throws: every other index still runs, the caller gets the exception after all have finished, and
// the pool serves the next call.
TEST(ThreadPool, AThrowingIndexReachesTheCallerAfterEveryIndexRan) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(64);
  EXPECT_THROW(pool.ParallelFor(64,
                                [&](int64_t i) {
                                  hits[i].fetch_add(1);
                                  if (i == 5 || i == 40) throw std::runtime_error("index failed");
                                }),
               std::runtime_error);
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i;
  std::atomic<int64_t> total{0};
  pool.ParallelFor(100, [&](int64_t i) { total.fetch_add(i); });
  EXPECT_EQ(total.load(), 4950);
}

}  // namespace
}  // namespace slide
