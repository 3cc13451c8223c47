#include "engine/runtime/update_worker.h"

#include "engine/common/thread_name.h"

#include <exception>
#include <utility>

namespace slide {

UpdateWorker::UpdateWorker(size_t num_units) : pending_(num_units, 0), thread_([this] { Loop(); }) {}

UpdateWorker::~UpdateWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void UpdateWorker::Post(size_t unit, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++pending_.at(unit);
    queue_.emplace_back(unit, std::move(task));
  }
  cv_.notify_all();
}

void UpdateWorker::Wait(size_t unit) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_.at(unit) == 0; });
}

bool UpdateWorker::Idle(size_t unit) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.at(unit) == 0;
}

void UpdateWorker::WaitAll() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    for (int64_t p : pending_)
      if (p != 0) return false;
    return true;
  });
}

std::string UpdateWorker::TakeError() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(error_, std::string());
}

void UpdateWorker::Loop() {
  NameThisThread("slide-update");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    auto [unit, task] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::string error;
    try {
      task();
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    if (!error.empty() && error_.empty()) error_ = error;
    --pending_[unit];
    cv_.notify_all();
  }
}

}  // namespace slide
