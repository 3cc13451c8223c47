// StoreWriter: one thread that performs the job store's writes (records, events, checkpoint removals) in the order
// they were posted, so that no RPC thread and not the engine thread waits on the disk while holding the job
// table's lock. Writes that must be durable before the caller goes on (a submission's record, a final record)
// are Run: queued like the others, and waited for.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "engine/common/status.h"

namespace slide {

class StoreWriter {
 public:
  StoreWriter();
  ~StoreWriter();  // performs everything posted, then stops
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // Queued behind every earlier write; a failure is the write's own business (it logs).
  void Post(std::function<void()> write);
  // Queued behind every earlier write, and waited for; its status.
  Status Run(std::function<Status()> write);
  // Waits until everything posted so far is done.
  void Drain();

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace slide
