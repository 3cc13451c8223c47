#include "engine/common/thread_pool.h"

#include <cstdlib>

#include "engine/common/thread_name.h"

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

void ThreadPool::Run(Call& call) {
  int64_t done = 0;
  std::exception_ptr error;
  for (int64_t i; (i = call.next.fetch_add(1)) < call.n;) {
    try {
      (*call.fn)(i);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    ++done;
  }
  if (done > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error && !call.error) call.error = error;
    call.finished += done;
    if (call.finished == call.n) done_cv_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  NameThisThread("slide-cpu");
  uint64_t seen = 0;
  while (true) {
    std::shared_ptr<Call> call;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      call = call_;
    }
    Run(*call);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    Call inline_call;
    inline_call.fn = &fn;
    inline_call.n = n;
    Run(inline_call);
    if (inline_call.error) std::rethrow_exception(inline_call.error);
    return;
  }
  std::lock_guard<std::mutex> one_at_a_time(call_mu_);
  auto call = std::make_shared<Call>();
  call->fn = &fn;
  call->n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    call_ = call;
    ++generation_;
  }
  work_cv_.notify_all();
  Run(*call);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return call->finished == call->n; });
  if (call->error) std::rethrow_exception(call->error);
}

}  // namespace slide
