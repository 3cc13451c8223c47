#include "server/store_writer.h"

#include <future>

#include "engine/common/thread_name.h"

namespace slide {

StoreWriter::StoreWriter() : thread_([this] { Loop(); }) {}

StoreWriter::~StoreWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StoreWriter::Post(std::function<void()> write) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(write));
  }
  cv_.notify_all();
}

Status StoreWriter::Run(std::function<Status()> write) {
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  Post([&] { done.set_value(write()); });
  return result.get();
}

void StoreWriter::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void StoreWriter::Loop() {
  NameThisThread("slide-store");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything posted is done
    std::function<void()> write = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    write();
    lock.lock();
    busy_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace slide
