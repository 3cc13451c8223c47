// UpdateWorker: one background thread that runs per-unit optimizer updates in the order they are posted,
// so CPU AdamW overlaps the engine thread's compute. The engine waits on a unit before it reads that unit's
// weights again, which keeps updates synchronous (step k+1 sees step k's weights).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace slide {

class UpdateWorker {
 public:
  explicit UpdateWorker(size_t num_units);
  ~UpdateWorker();
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  void Post(size_t unit, std::function<void()> task);
  void Wait(size_t unit);        // returns once every task posted for `unit` has finished
  bool Idle(size_t unit) const;  // no task of `unit` is pending (never blocks)
  void WaitAll();
  std::string TakeError();  // the first exception a task threw since the last call ("" if none)

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<size_t, std::function<void()>>> queue_;
  std::vector<int64_t> pending_;  // per unit
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace slide
