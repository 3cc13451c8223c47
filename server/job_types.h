// The daemon's job vocabulary: states, records and events, shared by the manager, the store and the service.
#pragma once

#include <cstdint>
#include <map>
#include <string>

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
  bool replayed = false;  // a step run again after a restart resumed from an earlier checkpoint
  JobState state = JobState::kQueued;
  std::string log;
};

struct JobRecord {
  std::string id;
  std::string name;
  TrainingJobSpec spec;
  JobState state = JobState::kQueued;
  int64_t step = 0, total_steps = 0;
  int64_t trainable_params = 0, model_params = 0;  // from the step events (0 before the first)
  double loss = 0, eval_loss = -1;
  std::string error, export_dir;
  int64_t created_unix_ms = 0, finished_unix_ms = 0;
  // Daemon deaths while this job ran, in a row without a new checkpoint, and the checkpoint step at the last one.
  int64_t interrupted_runs = 0, interrupted_at_step = 0;
};

// Told about progress by the job manager (the metrics implement it). Calls come from the engine thread or with
// the manager's lock held, so implementations only store figures.
class JobObserver {
 public:
  virtual ~JobObserver() = default;
  virtual void OnStep(const TrainingStepEvent& e, int64_t new_steps, int64_t tokens_per_step) = 0;
  virtual void OnJobCounts(const std::map<JobState, int>& by_state, int queued) = 0;
};

}  // namespace slide
