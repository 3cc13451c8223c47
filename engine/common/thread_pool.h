// ThreadPool: a fixed set of worker threads for data-parallel CPU loops (the optimizer update). Our own pool
// rather than at::parallel_for: ATen's OpenMP loop is a header template that runs serially in translation
// units built without -fopenmp, and a second OpenMP runtime beside LibTorch's bundled one is unsafe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace slide {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // `threads` - 1 workers; the caller is the last thread
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(i) for every i in [0, n), spread over the pool; returns when all calls have finished.
  // Concurrent callers are served one after another. If fn throws, the other indices still run and the first
  // exception is rethrown to the caller once every call has finished (fn is never used after the return).
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Process-wide pool: all cores but one (SLIDE_CPU_THREADS overrides).
  static ThreadPool& Default();

 private:
  // One ParallelFor call's work. Each call has its own: a worker that wakes late, or is still leaving, holds the
  // call it joined, finds its indices all claimed and leaves without touching the next call's function or counts.
  struct Call {
    const std::function<void(int64_t)>* fn = nullptr;  // valid until `finished` reaches `n`
    int64_t n = 0;
    std::atomic<int64_t> next{0};
    int64_t finished = 0;      // guarded by mu_
    std::exception_ptr error;  // the first exception an index threw; guarded by mu_
  };
  void WorkerLoop();
  void Run(Call& call);

  std::mutex call_mu_;  // one ParallelFor at a time
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::shared_ptr<Call> call_;  // the latest call; guarded by mu_
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace slide
