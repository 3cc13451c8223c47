// JobStore: the daemon's durable state directory.
//   <state_dir>/lock                      held (flock) by the one slided using the directory; holds its pid
//   <state_dir>/reserve                   space set aside for final records on a full disk
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

// Job ids are job-N with N in [1, kMaxJobNumber]: a directory named past it (job-9223372036854775807) is listed
// when its record is readable but never moves the next id, so ids cannot wrap or repeat.
constexpr int64_t kMaxJobNumber = 999'999'999'999;

// What the job manager writes through. Calls come from one thread at a time (the manager's StoreWriter, or its
// constructor), never with the job table's lock held.
class JobStore {
 public:
  virtual ~JobStore() = default;
  // A new job's directory, created exclusively: ALREADY there (an earlier daemon's, or a stray one) is
  // FAILED_PRECONDITION and the caller takes the next id, so a record is never overwritten by another job's.
  virtual Status CreateJobDir(const std::string& id) = 0;
  // Written on submission and on every state change. Progress (step, loss) is not rewritten per step: it is
  // the last metrics event, which LoadAll puts back into the record.
  virtual Status SaveRecord(const JobRecord& record) = 0;
  // A record in a final state: when the disk is full the reserve is given up to make room for it, so that a job
  // that finished is on disk as finished (and never runs again) before anyone is told so.
  virtual Status SaveFinalRecord(const JobRecord& record) = 0;
  virtual Status AppendEvent(const std::string& id, const JobEventRecord& event) = 0;
  // A finished job's checkpoints (12 bytes per parameter: 100 GB at 8B).
  virtual Status RemoveCheckpoints(const std::string& id) = 0;
  virtual std::string CheckpointDir(const std::string& id) const = 0;
  // Every job in the store, sorted by id; `problems` gets one line per file that could not be read.
  virtual std::vector<StoredJob> LoadAll(size_t max_events, std::vector<std::string>* problems) const = 0;
  // The largest N of the jobs/job-N entries, readable or not: new ids never reuse one.
  virtual int64_t HighestJobNumber() const = 0;
};

// The store as a directory (layout above).
class DirectoryJobStore final : public JobStore {
 public:
  explicit DirectoryJobStore(std::string state_dir) : dir_(std::move(state_dir)) {}
  ~DirectoryJobStore() override;
  DirectoryJobStore(const DirectoryJobStore&) = delete;
  DirectoryJobStore& operator=(const DirectoryJobStore&) = delete;

  // Creates the directories (owner-only), takes the directory's lock (FAILED_PRECONDITION naming the holder's pid
  // when another slided has it: two daemons must never run one queue), checks that it can be written and sets
  // aside the reserve that final records are written with when the disk is full.
  Status Init();

  Status CreateJobDir(const std::string& id) override;
  Status SaveRecord(const JobRecord& record) override;
  Status SaveFinalRecord(const JobRecord& record) override;
  Status AppendEvent(const std::string& id, const JobEventRecord& event) override;
  Status RemoveCheckpoints(const std::string& id) override;
  std::string CheckpointDir(const std::string& id) const override { return JobDir(id) + "/checkpoint"; }
  std::vector<StoredJob> LoadAll(size_t max_events, std::vector<std::string>* problems) const override;
  int64_t HighestJobNumber() const override;

  const std::string& dir() const { return dir_; }

 private:
  std::string JobDir(const std::string& id) const { return dir_ + "/jobs/" + id; }
  static void TrimTornLastLine(const std::string& path);
  void KeepReserve();  // best effort: a full disk leaves it missing until there is room again
  std::string dir_;
  int lock_fd_ = -1;
};

}  // namespace slide
