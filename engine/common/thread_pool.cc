#include "engine/common/thread_pool.h"

#include <cstdlib>

namespace slide {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("SLIDE_CPU_THREADS")) {
      int n = std::atoi(env);
      if (n > 0) return n;
    }
    // One core stays free for the engine thread, which launches the device work.
    return static_cast<int>(std::max(2u, std::thread::hardware_concurrency()) - 1);
  }());
  return pool;
}

void ThreadPool::RunTasks() {
  int64_t done = 0;
  for (int64_t i; (i = next_.fetch_add(1)) < n_;) {
    (*fn_)(i);
    ++done;
  }
  if (done > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ += done;
    if (finished_ == n_) done_cv_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    finished_ = 0;
    next_.store(0);
    ++generation_;
  }
  work_cv_.notify_all();
  RunTasks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return finished_ == n_; });
}

}  // namespace slide
