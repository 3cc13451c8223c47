// JobStore: the daemon's durable state directory.
//   <state_dir>/jobs/<id>/record.json     the job record (spec, state, progress, error), replaced atomically
//   <state_dir>/jobs/<id>/events.jsonl    the job's events, appended one JSON line each
//   <state_dir>/jobs/<id>/checkpoint/     training checkpoints (engine/runtime/training_checkpoint.h)
// After a crash or kill -9 LoadAll returns every job; a torn last event line is dropped, a corrupt record is
// reported and skipped so one bad file never stops the daemon.
#pragma once

#include <string>
#include <vector>

#include "engine/common/status.h"
#include "server/job_types.h"

namespace slide {

struct StoredJob {
  JobRecord record;
  std::vector<JobEventRecord> events;  // the newest `max_events`
};

class JobStore {
 public:
  explicit JobStore(std::string state_dir) : dir_(std::move(state_dir)) {}
  Status Init();  // creates the directories; fails when they cannot be created or written

  // Written on submission and on every state change. Progress (step, loss) is not rewritten per step: it is
  // the last metrics event, which LoadAll puts back into the record.
  Status SaveRecord(const JobRecord& record);
  Status AppendEvent(const std::string& id, const JobEventRecord& event);
  std::string CheckpointDir(const std::string& id) const { return dir_ + "/jobs/" + id + "/checkpoint"; }

  // Every job in the directory, sorted by id; `problems` gets one line per file that could not be read.
  std::vector<StoredJob> LoadAll(size_t max_events, std::vector<std::string>* problems) const;
  // The largest N of the jobs/job-N directories, readable or not: new ids never reuse one.
  int64_t HighestJobNumber() const;

  const std::string& dir() const { return dir_; }

 private:
  std::string JobDir(const std::string& id) const { return dir_ + "/jobs/" + id; }
  static void TrimTornLastLine(const std::string& path);
  std::string dir_;
};

}  // namespace slide
