// JobManager: the job table, the FIFO queue and the one engine thread that runs jobs. RPC threads call in
// and never touch the engine; each job keeps a bounded tail of events that watchers read by sequence number.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/common/status.h"
#include "engine/runtime/training_job.h"

namespace slide {

enum class JobState { kQueued, kPreparing, kRunning, kSucceeded, kFailed, kCancelled };
const char* JobStateName(JobState s);
inline bool IsFinal(JobState s) {
  return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled;
}

struct JobEventRecord {
  enum class Kind { kMetrics, kState, kLog } kind = Kind::kLog;
  int64_t seq = 0;
  TrainingStepEvent metrics;
  JobState state = JobState::kQueued;
  std::string log;
};

struct JobRecord {
  std::string id;
  std::string name;
  TrainingJobSpec spec;
  JobState state = JobState::kQueued;
  int64_t step = 0, total_steps = 0;
  double loss = 0, eval_loss = -1;
  std::string error, export_dir;
  int64_t created_unix_ms = 0, finished_unix_ms = 0;
};

struct JobManagerOptions {
  size_t max_events_per_job = 4096;  // older events are dropped; a watcher that falls behind skips ahead
};

class JobManager {
 public:
  explicit JobManager(JobManagerOptions options = {});
  ~JobManager();

  StatusOr<JobRecord> Submit(const std::string& name, const TrainingJobSpec& spec);
  StatusOr<JobRecord> Get(const std::string& id) const;
  std::vector<JobRecord> List(std::optional<JobState> state) const;  // in submission order
  StatusOr<JobRecord> Cancel(const std::string& id);                 // idempotent

  // Events with seq > after_seq, waiting up to `wait_ms` for the first one. `final` tells whether the job has
  // ended (and every event up to its end has been returned).
  StatusOr<std::vector<JobEventRecord>> Events(const std::string& id, int64_t after_seq, int wait_ms, bool* final);

  int queued() const;
  std::string running() const;
  void Shutdown();  // cancels the running job, fails nothing else, stops the engine thread

 private:
  struct Job {
    JobRecord record;
    std::deque<JobEventRecord> events;
    int64_t next_seq = 1;
    std::atomic<bool> cancel{false};
  };
  void EngineLoop();
  void AddEvent(Job& job, JobEventRecord e);  // mu_ held
  void SetState(Job& job, JobState s);        // mu_ held

  JobManagerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // queue changes, new events
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::vector<std::string> order_;
  std::deque<std::string> queue_;
  std::string running_;
  int64_t next_id_ = 1;
  bool stop_ = false;
  std::thread engine_;
};

}  // namespace slide
