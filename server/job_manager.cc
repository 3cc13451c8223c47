#include "server/job_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/common/thread_name.h"
#include "engine/common/utf8.h"
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

JobEnvironment JobManager::EnvironmentOf(const std::string& id) const {
  JobEnvironment env;
  env.allowed_roots = options_.allowed_roots;  // the daemon's settings now, never a stored copy
  env.nvme = options_.nvme;
  env.default_gpu_budget_bytes = options_.default_gpu_budget_bytes;
  if (options_.store != nullptr && !id.empty()) {
    env.checkpoint_dir = options_.store->CheckpointDir(id);
    env.default_checkpoint_every = options_.default_checkpoint_every;
  }
  return env;
}

JobManager::JobManager(JobManagerOptions options, std::vector<std::string>* problems) : options_(options) {
  if (options_.store != nullptr) LoadStoredJobs(problems);
  engine_ = std::thread([this] { EngineLoop(); });
}

void JobManager::LoadStoredJobs(std::vector<std::string>* problems) {
  std::vector<std::string> bad;
  std::lock_guard<std::mutex> lock(mu_);  // no other thread yet; the helpers expect it held
  for (StoredJob& stored : options_.store->LoadAll(options_.max_events_per_job, &bad)) {
    auto job = std::make_unique<Job>();
    job->record = std::move(stored.record);
    job->events.assign(stored.events.begin(), stored.events.end());
    job->next_seq = job->events.empty() ? 1 : job->events.back().seq + 1;
    const std::string id = job->record.id;
    order_.push_back(id);
    Job& j = *(jobs_[id] = std::move(job));
    if (IsFinal(j.record.state)) continue;
    // The work after the last checkpoint is lost: progress goes back to the checkpoint, and the steps run again
    // are marked replayed for watchers.
    auto checkpoint = options_.engine->ResumeStep(options_.store->CheckpointDir(id));
    const int64_t resume_step = checkpoint.ok() ? checkpoint.value() : 0;
    const bool was_running = j.record.state != JobState::kQueued;  // not stopped by a clean shutdown
    if (was_running && !MayResumeAfterCrash(j, resume_step)) continue;
    // The furthest step ever reported (a second crash during the replay must not forget the first one's).
    for (const auto& ev : j.events)
      if (ev.kind == JobEventRecord::Kind::kMetrics) j.replay_until = std::max(j.replay_until, ev.metrics.step);
    j.record.step = resume_step;
    JobEventRecord e;
    e.log = "daemon restarted: queued again; " +
            (!checkpoint.ok()  ? "its checkpoint is unreadable (" + checkpoint.status().message() + ")"
             : resume_step > 0 ? "resumes from the checkpoint at step " + std::to_string(resume_step)
                               : std::string("resumes from the start"));
    if (j.replay_until > resume_step)
      e.log += "; steps " + std::to_string(resume_step + 1) + ".." + std::to_string(j.replay_until) +
               " run again and are marked replayed";
    AddEvent(j, e);
    if (j.record.state != JobState::kQueued) SetState(j, JobState::kQueued);  // also persists the run count
    queue_.push_back(id);
  }
  // Every job directory's id, readable or not, stays taken.
  next_id_ = options_.store->HighestJobNumber() + 1;
  if (problems != nullptr) *problems = std::move(bad);
  PublishCounts();
}

bool JobManager::MayResumeAfterCrash(Job& job, int64_t resume_step) {
  JobRecord& r = job.record;
  r.interrupted_runs = resume_step > r.interrupted_at_step || r.interrupted_runs == 0 ? 1 : r.interrupted_runs + 1;
  r.interrupted_at_step = resume_step;
  if (r.interrupted_runs <= options_.max_interrupted_runs) return true;
  r.error = "the daemon stopped while running this job " + std::to_string(r.interrupted_runs) +
            " times in a row without a new checkpoint (last from step " + std::to_string(resume_step) +
            "); failed instead of resumed again (jobs.max_interrupted_runs is " +
            std::to_string(options_.max_interrupted_runs) +
            "): look for the cause in slided's log and the kernel's (e.g. the OOM killer), then submit it again";
  JobEventRecord e;
  e.log = "error: " + r.error;
  AddEvent(job, e);
  auto failed = WriteFinal(r, JobState::kFailed);  // only the constructor's thread runs: safe under mu_
  if (!failed.ok()) {  // not written: it stays unfinished on disk and is judged again at the next start
    LogError(failed.status().ToString());
    r.state = JobState::kFailed;
  } else {
    r = std::move(failed).value();
  }
  Announce(job, JobState::kFailed);
  return false;
}

JobManager::~JobManager() { Shutdown(); }

void JobManager::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      stop_ = true;
      if (!running_.empty()) (options_.store != nullptr ? jobs_[running_]->suspend : jobs_[running_]->cancel) = true;
    }
  }
  cv_.notify_all();
  if (engine_.joinable()) engine_.join();
  writer_.Drain();
}

void JobManager::Persist(const Job& job) {
  if (options_.store == nullptr) return;
  JobStore* store = options_.store;
  writer_.Post([store, record = job.record] {
    if (Status st = store->SaveRecord(record); !st.ok()) LogError(st.ToString());
  });
}

void JobManager::AddEvent(Job& job, JobEventRecord e) {
  e.seq = job.next_seq++;
  // Messages can quote bytes from users' files; gRPC strings and the JSON store need valid UTF-8, so invalid
  // sequences become U+FFFD here, once, and memory, disk and clients all hold the same text.
  e.log = Utf8Lossy(e.log);
  if (options_.store != nullptr) {
    JobStore* store = options_.store;
    writer_.Post([store, id = job.record.id, e] {
      if (Status st = store->AppendEvent(id, e); !st.ok()) LogError(st.ToString());
    });
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

StatusOr<JobRecord> JobManager::WriteFinal(JobRecord record, JobState s) {
  record.state = s;
  record.finished_unix_ms = NowMs();
  if (options_.store != nullptr) {
    JobStore* store = options_.store;
    SLIDE_RETURN_IF_ERROR(writer_.Run([store, &record] { return store->SaveFinalRecord(record); }));
  }
  return record;
}

void JobManager::FinishJob(Job& job, JobState s, std::unique_lock<std::mutex>& lock) {
  for (int attempt = 0;; ++attempt) {
    const JobRecord current = job.record;
    lock.unlock();
    auto done = WriteFinal(current, s);
    lock.lock();
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
  SLIDE_ASSIGN_OR_RETURN(std::string plan, options_.engine->Plan(spec, EnvironmentOf("")));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Status(StatusCode::kUnavailable, "the daemon is shutting down");
  }
  // The id and the record are made on disk before the job exists in memory: an acknowledged job survives a crash.
  std::lock_guard<std::mutex> submitting(submit_mu_);
  auto job = std::make_unique<Job>();
  JobRecord& r = job->record;
  while (true) {
    if (next_id_ > kMaxJobNumber)
      return ResourceExhausted("no job ids left (the last is job-" + std::to_string(kMaxJobNumber) + ")");
    char id[32];
    std::snprintf(id, sizeof(id), "job-%06lld", static_cast<long long>(next_id_++));
    r.id = id;
    if (options_.store == nullptr) break;
    JobStore* store = options_.store;
    // The directory is made exclusively: one that exists (a stray copy, an earlier daemon's) keeps its id.
    const Status made = writer_.Run([store, &r] { return store->CreateJobDir(r.id); });
    if (made.ok()) break;
    if (made.message().find("already exists") == std::string::npos) return made;  // the disk refused
  }
  r.name = name;
  r.spec = spec;
  r.created_unix_ms = NowMs();
  r.state = JobState::kQueued;
  if (options_.store != nullptr) {
    JobStore* store = options_.store;
    const Status saved = writer_.Run([store, &r] { return store->SaveRecord(r); });
    if (!saved.ok()) return Status(StatusCode::kUnavailable, "cannot record the job: " + saved.message());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return Status(StatusCode::kUnavailable, "the daemon is shutting down");  // its record stays queued
  const std::string id = r.id;
  order_.push_back(id);
  queue_.push_back(id);
  Job& j = *(jobs_[id] = std::move(job));
  Announce(j, JobState::kQueued);
  JobEventRecord planned;
  planned.log = "memory plan at submission:\n" + plan;
  AddEvent(j, planned);
  cv_.notify_all();
  return j.record;
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
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job " + QuoteInput(id));
  Job& job = *it->second;
  if (job.record.state == JobState::kQueued && !job.finishing) {
    // Out of the queue first (the engine thread must not start it meanwhile), then on disk, then in memory: a
    // cancellation the store did not take would be undone by the next start.
    const auto at = std::find(queue_.begin(), queue_.end(), id);
    const size_t position = static_cast<size_t>(at - queue_.begin());
    if (at != queue_.end()) queue_.erase(at);
    job.finishing = true;
    const JobRecord current = job.record;
    lock.unlock();
    auto cancelled = WriteFinal(current, JobState::kCancelled);
    lock.lock();
    job.finishing = false;
    if (!cancelled.ok()) {
      queue_.insert(queue_.begin() + static_cast<std::ptrdiff_t>(std::min(position, queue_.size())), id);
      cv_.notify_all();
      return Status(StatusCode::kUnavailable, "cannot record the cancellation: " + cancelled.status().message());
    }
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
      job->record.trainable_params = s.trainable_params;
      job->record.model_params = s.model_params;
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
    auto result =
        options_.engine->Run(job->record.spec, EnvironmentOf(job->record.id), cb, &job->cancel, &job->suspend);
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
      if (IsFinal(job->record.state) && options_.store != nullptr) {
        // Up to 12 bytes per parameter: removed on the store's thread, while the table stays readable.
        JobStore* store = options_.store;
        writer_.Post([store, id = job->record.id] {
          if (Status st = store->RemoveCheckpoints(id); !st.ok()) LogError(st.ToString());
        });
      }
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
