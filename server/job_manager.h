// JobManager: the job table, the FIFO queue and the one engine thread that runs jobs through the Engine seam
// (engine/engine.h). RPC threads call in and never touch the engine; each job keeps a bounded tail of events that
// watchers read by sequence number. The table's lock guards memory only: every store write goes through the
// StoreWriter's thread, outside the lock, so GetJob/ListJobs/WatchJob never wait on the disk.
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
#include "engine/engine.h"
#include "server/job_store.h"
#include "server/job_types.h"
#include "server/store_writer.h"

namespace slide {

struct JobManagerOptions {
  Engine* engine = nullptr;                       // required; plans and runs the jobs
  JobStore* store = nullptr;                      // durable state; nullptr keeps jobs in memory only
  size_t max_events_per_job = 4096;               // older events are dropped; a watcher that falls behind skips ahead
  int64_t default_checkpoint_every = 100;         // for jobs that leave checkpoint_every at 0 (needs a store)
  int64_t default_gpu_budget_bytes = 24ll << 30;  // for jobs that leave gpu_budget_bytes at 0
  JobObserver* observer = nullptr;                // metrics
  std::vector<std::string> allowed_roots;         // every file a job opens must resolve under one of these (empty: any)
  StateTierOptions nvme;                          // the NVMe tier's directories and I/O settings (mode set by each job)
  // A job the daemon died under this many times in a row, with no new checkpoint in between, fails at the next
  // start instead of being resumed again (one job that kills the daemon must not make it crash-loop).
  int64_t max_interrupted_runs = 3;
};

// Job names are shown in terminals and logs: bounded, valid UTF-8, no control characters.
constexpr size_t kMaxJobNameBytes = 128;
Status ValidateJobName(const std::string& name);

class JobManager {
 public:
  // With a store, every job it holds is loaded first: finished ones are listed, the others queued again in
  // submission order (a job that was running resumes from its checkpoint). `problems` gets unreadable files.
  explicit JobManager(JobManagerOptions options, std::vector<std::string>* problems = nullptr);
  ~JobManager();

  // The spec is stored and shown exactly as given; the daemon's settings reach the engine as a JobEnvironment.
  StatusOr<JobRecord> Submit(const std::string& name, const TrainingJobSpec& spec);
  StatusOr<JobRecord> Get(const std::string& id) const;
  std::vector<JobRecord> List(std::optional<JobState> state) const;  // in submission order
  StatusOr<JobRecord> Cancel(const std::string& id);                 // idempotent

  // Events with seq > after_seq, waiting up to `wait_ms` for the first one. `final` tells whether the job has
  // ended (and every event up to its end has been returned).
  StatusOr<std::vector<JobEventRecord>> Events(const std::string& id, int64_t after_seq, int wait_ms, bool* final);

  int queued() const;
  int total() const;  // every job the daemon knows
  std::string running() const;
  // Stops the engine thread. The running job checkpoints at its next step boundary and stays queued for the
  // next start (without a store it is cancelled); queued jobs stay queued. Every store write is done on return.
  void Shutdown();

 private:
  struct Job {
    JobRecord record;
    std::deque<JobEventRecord> events;
    int64_t next_seq = 1;
    int64_t replay_until = 0;  // after a restart: steps up to here ran before and are run again
    bool finishing = false;    // a final record is being written (Cancel of a queued job)
    std::atomic<bool> cancel{false};
    std::atomic<bool> suspend{false};
  };
  void EngineLoop();
  JobEnvironment EnvironmentOf(const std::string& id) const;  // the daemon's settings for one job
  void LoadStoredJobs(std::vector<std::string>* problems);    // constructor, before the engine thread
  void AddEvent(Job& job, JobEventRecord e);                  // mu_ held; the write is posted
  void SetState(Job& job, JobState s);                        // mu_ held; not for final states (FinishJob)
  void Announce(Job& job, JobState s);                        // mu_ held: the state event, counts and log line
  void Persist(const Job& job);                               // mu_ held; the write is posted
  void PublishCounts();                                       // mu_ held
  // The record in final state `s`, written to the store (SaveFinalRecord, waited for; call without mu_ held).
  StatusOr<JobRecord> WriteFinal(JobRecord record, JobState s);
  // The job's end: written to the store before memory and watchers see it. While the store refuses, the job stays
  // in its running state with a log line and the write is retried every second; a daemon stopped before it
  // succeeds leaves the job unfinished on disk, so it is resumed, never lost. Takes and returns with `lock` held
  // (released while it writes).
  void FinishJob(Job& job, JobState s, std::unique_lock<std::mutex>& lock);
  // After a restart: the job was running when the daemon died (resume_step: its checkpoint). Counts the run as
  // interrupted; false when it has been interrupted too often without progress (then it is marked FAILED).
  bool MayResumeAfterCrash(Job& job, int64_t resume_step);

  JobManagerOptions options_;
  StoreWriter writer_;          // before the table: it outlives every post the table makes
  std::mutex submit_mu_;        // one submission at a time picks an id and writes its record (not mu_)
  int64_t next_id_ = 1;         // guarded by submit_mu_
  mutable std::mutex mu_;       // the table below; never held across disk I/O
  std::condition_variable cv_;  // queue changes, new events
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::vector<std::string> order_;
  std::deque<std::string> queue_;
  std::string running_;
  bool stop_ = false;
  std::thread engine_;
};

}  // namespace slide
