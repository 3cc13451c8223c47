#include "server/job_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/common/files.h"
#include "engine/common/thread_name.h"
#include "engine/common/utf8.h"
#include "engine/runtime/training_checkpoint.h"
#include "server/log.h"

namespace slide {
namespace {
int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kPreparing:
      return "PREPARING";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "?";
}

Status ValidateJobName(const std::string& name) {
  if (name.size() > kMaxJobNameBytes)
    return InvalidArgument("job field 'name' is " + std::to_string(name.size()) + " bytes; at most " +
                           std::to_string(kMaxJobNameBytes) + " are allowed");
  if (!IsValidUtf8(name)) return InvalidArgument("job field 'name' is not valid UTF-8");
  // C0 and DEL, C1 (U+0080..U+009F, e.g. the single-character CSI) and bidirectional overrides/isolates
  // (U+202A..U+202E, U+2066..U+2069) can rewrite what a terminal shows.
  for (size_t i = 0; i < name.size();) {
    const auto c = static_cast<unsigned char>(name[i]);
    const size_t len = Utf8Len(c);
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(name[i + k]) & 0x3F);
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069))
      return InvalidArgument("job field 'name' contains control characters");
    i += len;
  }
  return Status::Ok();
}

TrainingJobSpec JobManager::Confined(TrainingJobSpec spec) const {
  spec.allowed_roots = options_.allowed_roots;  // the daemon's roots now, never a stored copy
  spec.nvme = options_.nvme;                    // likewise the tier's directories
  return spec;
}

JobManager::JobManager(JobManagerOptions options, std::vector<std::string>* problems) : options_(options) {
  if (options_.store != nullptr) {
    std::vector<std::string> bad;
    for (StoredJob& stored : options_.store->LoadAll(options_.max_events_per_job, &bad)) {
      auto job = std::make_unique<Job>();
      job->record = std::move(stored.record);
      job->events.assign(stored.events.begin(), stored.events.end());
      job->next_seq = job->events.empty() ? 1 : job->events.back().seq + 1;
      const std::string id = job->record.id;
      if (!IsFinal(job->record.state)) {
        // The work after the last checkpoint is lost: progress goes back to the checkpoint, and the steps run
        // again are marked replayed for watchers.
        auto checkpoint = ReadCheckpointInfo(job->record.spec.checkpoint_dir);
        const int64_t resume_step = checkpoint.ok() && checkpoint.value() ? checkpoint.value()->step : 0;
        const bool was_running = job->record.state != JobState::kQueued;  // not stopped by a clean shutdown
        if (was_running && !MayResumeAfterCrash(*job, resume_step)) {
          order_.push_back(id);
          jobs_[id] = std::move(job);
          continue;
        }
        // The furthest step ever reported (a second crash during the replay must not forget the first one's).
        for (const auto& ev : job->events)
          if (ev.kind == JobEventRecord::Kind::kMetrics)
            job->replay_until = std::max(job->replay_until, ev.metrics.step);
        job->record.step = resume_step;
        JobEventRecord e;
        e.log = "daemon restarted: queued again; " +
                (!checkpoint.ok()  ? "its checkpoint is unreadable (" + checkpoint.status().message() + ")"
                 : resume_step > 0 ? "resumes from the checkpoint at step " + std::to_string(resume_step)
                                   : std::string("resumes from the start"));
        if (job->replay_until > resume_step)
          e.log += "; steps " + std::to_string(resume_step + 1) + ".." + std::to_string(job->replay_until) +
                   " run again and are marked replayed";
        AddEvent(*job, e);
        if (job->record.state != JobState::kQueued) SetState(*job, JobState::kQueued);
        queue_.push_back(id);
      }
      order_.push_back(id);
      jobs_[id] = std::move(job);
    }
    // Every job directory's id, readable or not, stays taken.
    next_id_ = options_.store->HighestJobNumber() + 1;
    if (problems != nullptr) *problems = std::move(bad);
    PublishCounts();
  }
  engine_ = std::thread([this] { EngineLoop(); });
}

bool JobManager::MayResumeAfterCrash(Job& job, int64_t resume_step) {
  JobRecord& r = job.record;
  r.interrupted_runs = resume_step > r.interrupted_at_step || r.interrupted_runs == 0 ? 1 : r.interrupted_runs + 1;
  r.interrupted_at_step = resume_step;
  if (r.interrupted_runs <= options_.max_interrupted_runs) return true;  // persisted as the job is queued again
  r.error = "the daemon stopped while running this job " + std::to_string(r.interrupted_runs) +
            " times in a row without a new checkpoint (last from step " + std::to_string(resume_step) +
            "); failed instead of resumed again (jobs.max_interrupted_runs is " +
            std::to_string(options_.max_interrupted_runs) +
            "): look for the cause in slided's log and the kernel's (e.g. the OOM killer), then submit it again";
  JobEventRecord e;
  e.log = "error: " + r.error;
  AddEvent(job, e);
  auto failed = Finalized(job, JobState::kFailed);
  if (!failed.ok()) {  // not written: it stays unfinished on disk and is judged again at the next start
    LogError(failed.status().ToString());
    failed = r;
    failed->state = JobState::kFailed;
  }
  r = std::move(failed).value();
  Announce(job, JobState::kFailed);
  return false;
}

JobManager::~JobManager() { Shutdown(); }

void JobManager::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    if (!running_.empty()) {
      if (options_.store != nullptr) {
        jobs_[running_]->suspend = true;
      } else {
        jobs_[running_]->cancel = true;
      }
    }
  }
  cv_.notify_all();
  if (engine_.joinable()) engine_.join();
}

void JobManager::Persist(const Job& job) {
  if (options_.store == nullptr) return;
  Status st = options_.store->SaveRecord(job.record);
  if (!st.ok()) LogError(st.ToString());
}

void JobManager::AddEvent(Job& job, JobEventRecord e) {
  e.seq = job.next_seq++;
  // Messages can quote bytes from users' files; gRPC strings and the JSON store need valid UTF-8, so invalid
  // sequences become U+FFFD here, once, and memory, disk and clients all hold the same text.
  e.log = Utf8Lossy(e.log);
  if (options_.store != nullptr) {
    Status st = options_.store->AppendEvent(job.record.id, e);
    if (!st.ok()) LogError(st.ToString());
  }
  if (!e.log.empty() && LogEnabled(LogLevel::kDebug)) Log(LogLevel::kDebug, "job " + job.record.id + ": " + e.log);
  job.events.push_back(std::move(e));
  while (job.events.size() > options_.max_events_per_job) job.events.pop_front();
  cv_.notify_all();
}

void JobManager::PublishCounts() {
  if (options_.observer == nullptr) return;
  std::map<JobState, int> counts;
  for (const auto& [id, job] : jobs_) ++counts[job->record.state];
  options_.observer->OnJobCounts(counts, static_cast<int>(queue_.size()));
}

void JobManager::SetState(Job& job, JobState s) {
  job.record.state = s;
  Persist(job);
  Announce(job, s);
}

void JobManager::Announce(Job& job, JobState s) {
  JobEventRecord e;
  e.kind = JobEventRecord::Kind::kState;
  e.state = s;
  AddEvent(job, e);
  PublishCounts();
  // One line per transition for the operator's journal; a failure says why.
  const std::string what = "job " + job.record.id + " (" + job.record.name + ") " + JobStateName(s);
  if (s == JobState::kFailed) {
    LogWarning(what + ": " + job.record.error);
  } else {
    LogInfo(what);
  }
}

StatusOr<JobRecord> JobManager::Finalized(const Job& job, JobState s) const {
  JobRecord final_record = job.record;
  final_record.state = s;
  final_record.finished_unix_ms = NowMs();
  if (options_.store != nullptr) SLIDE_RETURN_IF_ERROR(options_.store->SaveFinalRecord(final_record));
  return final_record;
}

void JobManager::FinishJob(Job& job, JobState s, std::unique_lock<std::mutex>& lock) {
  for (int attempt = 0;; ++attempt) {
    auto done = Finalized(job, s);
    if (done.ok()) {
      job.record = std::move(done).value();  // durable now: memory, watchers and metrics may see the end
      Announce(job, s);
      return;
    }
    if (attempt == 0) {
      LogError("job " + job.record.id + " ended " + JobStateName(s) +
               " but its record cannot be written: " + done.status().ToString() + "; retrying every second");
      JobEventRecord e;
      e.log = std::string("the job ended ") + JobStateName(s) +
              "; waiting for the state directory to take its record (" + done.status().message() + ")";
      AddEvent(job, e);
    }
    if (stop_) return;  // left unfinished on disk: the next start resumes it from its checkpoint
    cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_; });
  }
}

StatusOr<JobRecord> JobManager::Submit(const std::string& name, const TrainingJobSpec& spec) {
  SLIDE_RETURN_IF_ERROR(ValidateJobName(name));
  // Validates the spec and its paths, then refuses what cannot fit now, with the numbers, rather than when the
  // job reaches the engine.
  SLIDE_ASSIGN_OR_RETURN(std::string plan, PlanTrainingJob(Confined(spec)));
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return Status(StatusCode::kUnavailable, "the daemon is shutting down");
  char id[32];
  while (true) {
    if (next_id_ > kMaxJobNumber)
      return ResourceExhausted("no job ids left (the last is job-" + std::to_string(kMaxJobNumber) + ")");
    std::snprintf(id, sizeof(id), "job-%06lld", static_cast<long long>(next_id_++));
    if (jobs_.count(id) != 0) continue;
    // The directory is made exclusively: one that exists (a stray copy, an earlier daemon's) keeps its id.
    if (options_.store == nullptr) break;
    Status made = options_.store->CreateJobDir(id);
    if (made.ok()) break;
    if (!PathExists(options_.store->dir() + "/jobs/" + id)) return made;  // not a taken id: the disk refused
  }
  auto job = std::make_unique<Job>();
  job->record.id = id;
  job->record.name = name;
  job->record.spec = spec;
  job->record.created_unix_ms = NowMs();
  if (options_.store != nullptr) {
    job->record.spec.checkpoint_dir = options_.store->CheckpointDir(id);
    if (job->record.spec.checkpoint_every == 0) job->record.spec.checkpoint_every = options_.default_checkpoint_every;
  }
  SetState(*job, JobState::kQueued);
  JobEventRecord planned;
  planned.log = "memory plan at submission:\n" + plan;
  AddEvent(*job, planned);
  JobRecord copy = job->record;
  order_.push_back(id);
  queue_.push_back(id);
  jobs_[id] = std::move(job);
  PublishCounts();
  cv_.notify_all();
  return copy;
}

StatusOr<JobRecord> JobManager::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job " + QuoteInput(id));
  return it->second->record;
}

std::vector<JobRecord> JobManager::List(std::optional<JobState> state) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobRecord> out;
  for (const auto& id : order_) {
    const JobRecord& r = jobs_.at(id)->record;
    if (!state || r.state == *state) out.push_back(r);
  }
  return out;
}

StatusOr<JobRecord> JobManager::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job " + QuoteInput(id));
  Job& job = *it->second;
  if (job.record.state == JobState::kQueued) {
    // On disk first: a cancellation the store did not take would be undone by the next start.
    auto cancelled = Finalized(job, JobState::kCancelled);
    if (!cancelled.ok())
      return Status(StatusCode::kUnavailable, "cannot record the cancellation: " + cancelled.status().message());
    queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
    job.record = std::move(cancelled).value();
    Announce(job, JobState::kCancelled);
  } else if (!IsFinal(job.record.state)) {
    job.cancel = true;  // the engine thread stops at the next step boundary
  }
  return job.record;
}

StatusOr<std::vector<JobEventRecord>> JobManager::Events(const std::string& id, int64_t after_seq, int wait_ms,
                                                         bool* final) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job " + QuoteInput(id));
  Job& job = *it->second;
  cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return job.next_seq - 1 > after_seq || stop_; });
  std::vector<JobEventRecord> out;
  for (const auto& e : job.events)
    if (e.seq > after_seq) out.push_back(e);
  *final = IsFinal(job.record.state) && (out.empty() || out.back().seq == job.next_seq - 1);
  return out;
}

int JobManager::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

int JobManager::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(order_.size());
}

std::string JobManager::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

void JobManager::EngineLoop() {
  NameThisThread("slide-engine");
  while (true) {
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      running_ = queue_.front();
      queue_.pop_front();
      job = jobs_[running_].get();
      SetState(*job, JobState::kPreparing);
    }
    int64_t last_step = job->record.step;
    TrainingCallbacks cb;
    cb.on_log = [&](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu_);
      JobEventRecord e;
      e.log = m;
      AddEvent(*job, e);
    };
    cb.on_step = [&](const TrainingStepEvent& s) {
      std::lock_guard<std::mutex> lock(mu_);
      if (job->record.state == JobState::kPreparing) SetState(*job, JobState::kRunning);
      job->record.step = s.step;
      job->record.total_steps = s.total_steps;
      job->record.loss = s.loss;
      if (options_.observer != nullptr) {
        options_.observer->OnStep(s, std::max<int64_t>(1, s.step - last_step),
                                  job->record.spec.batch_size * job->record.spec.seq_len);
      }
      last_step = s.step;
      JobEventRecord e;
      e.kind = JobEventRecord::Kind::kMetrics;
      e.metrics = s;
      e.replayed = s.step <= job->replay_until;
      AddEvent(*job, e);
    };
    auto result = RunTrainingJob(Confined(job->record.spec), cb, &job->cancel, &job->suspend);
    std::unique_lock<std::mutex> lock(mu_);
    if (result.ok() && result->suspended) {
      JobEventRecord e;
      e.log = "suspended at step " + std::to_string(result->steps) +
              " for shutdown; resumes from its checkpoint when the daemon starts again";
      AddEvent(*job, e);
      SetState(*job, JobState::kQueued);
    } else if (result.ok()) {
      job->record.eval_loss = result->eval_loss;
      job->record.export_dir = result->export_dir;
      FinishJob(*job, JobState::kSucceeded, lock);  // durable first: a crash now must not train the job again
      if (IsFinal(job->record.state) && !job->record.spec.checkpoint_dir.empty())
        (void)RemoveTree(job->record.spec.checkpoint_dir);
    } else if (result.status().code() == StatusCode::kCancelled) {
      job->record.error = Utf8Lossy(result.status().message());
      FinishJob(*job, JobState::kCancelled, lock);
    } else {
      job->record.error = Utf8Lossy(result.status().ToString());
      JobEventRecord e;
      e.log = "error: " + job->record.error;
      AddEvent(*job, e);
      FinishJob(*job, JobState::kFailed, lock);
    }
    running_.clear();
  }
}

}  // namespace slide
