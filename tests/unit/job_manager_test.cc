// The job manager against fakes of its two seams (tests/support/fake_engine.h), in-process and without LibTorch:
// queueing, cancellation, shutdown and resume, crash loops, failures, and that the table stays readable while the
// store is slow.
#include "server/job_manager.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "tests/support/fake_engine.h"

namespace slide {
namespace {

using testing::FakeEngine;
using testing::MemoryStore;
using Clock = std::chrono::steady_clock;

TrainingJobSpec Spec(const std::string& name) {
  TrainingJobSpec s;
  s.model_dir = name;  // the fake engine keys its scripts by model_dir
  s.output_dir = "/out/" + name;
  return s;
}

// Polls until `done` holds for the job (or 20 s pass); its last record.
JobRecord WaitFor(JobManager& m, const std::string& id, const std::function<bool(const JobRecord&)>& done) {
  JobRecord r;
  for (int i = 0; i < 2000; ++i) {
    r = m.Get(id).value();
    if (done(r)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return r;
}
JobManagerOptions WithMaxInterruptedRuns(JobManagerOptions o, int64_t n) {
  o.max_interrupted_runs = n;
  return o;
}

JobManagerOptions Options(FakeEngine& engine, MemoryStore& store) {
  JobManagerOptions o;
  o.engine = &engine;
  o.store = &store;
  return o;
}

JobRecord WaitFinal(JobManager& m, const std::string& id) {
  return WaitFor(m, id, [](const JobRecord& r) { return IsFinal(r.state); });
}

std::vector<std::string> Logs(JobManager& m, const std::string& id) {
  bool final = false;
  std::vector<std::string> out;
  const auto events = m.Events(id, 0, 0, &final);
  for (const auto& e : events.value())
    if (e.kind == JobEventRecord::Kind::kLog) out.push_back(e.log);
  return out;
}

TEST(JobManager, RunsJobsInSubmissionOrderAndEndsEachAsItsRunDid) {
  FakeEngine engine;
  engine.scripts["c"] = {2, InvalidArgument("c.jsonl:3: not valid JSON")};
  MemoryStore store;
  JobManager m(Options(engine, store));
  const std::string a = m.Submit("a", Spec("a")).value().id, b = m.Submit("b", Spec("b")).value().id;
  const std::string c = m.Submit("c", Spec("c")).value().id;
  EXPECT_EQ(m.queued() + (m.running().empty() ? 0 : 1), 3);
  engine.Open();
  EXPECT_EQ(WaitFinal(m, a).state, JobState::kSucceeded);
  EXPECT_EQ(WaitFinal(m, b).state, JobState::kSucceeded);
  const JobRecord failed = WaitFinal(m, c);
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(failed.error, "INVALID_ARGUMENT: c.jsonl:3: not valid JSON");
  EXPECT_EQ(engine.started(), (std::vector<std::string>{"a", "b", "c"}));
  m.Shutdown();
  EXPECT_EQ(store.Record(a).state, JobState::kSucceeded);
  EXPECT_EQ(store.Record(c).state, JobState::kFailed);
  EXPECT_EQ(store.removals, 2);  // the succeeded jobs' checkpoints
}

// The stored spec is exactly what the user sent; the daemon's settings travel as the job's environment.
TEST(JobManager, TheSpecIsStoredAsSentAndTheDaemonsSettingsTravelBesideIt) {
  FakeEngine engine;
  MemoryStore store;
  JobManagerOptions o = Options(engine, store);
  o.default_checkpoint_every = 7;
  o.allowed_roots = {"/srv/models"};
  o.nvme.io.dirs = {"/mnt/nvme0"};
  JobManager m(o);
  const std::string id = m.Submit("a", Spec("a")).value().id;
  engine.Open();
  WaitFinal(m, id);
  m.Shutdown();
  EXPECT_EQ(store.Record(id).spec.checkpoint_every, 0);
  ASSERT_EQ(engine.environments().size(), 1u);
  const JobEnvironment env = engine.environments()[0];
  EXPECT_EQ(env.checkpoint_dir, "/ckpt/" + id);
  EXPECT_EQ(env.default_checkpoint_every, 7);
  EXPECT_EQ(env.allowed_roots, std::vector<std::string>{"/srv/models"});
  EXPECT_EQ(env.nvme.io.dirs, std::vector<std::string>{"/mnt/nvme0"});
}

TEST(JobManager, CancelEndsAQueuedJobAtOnceAndARunningOneAtItsNextStep) {
  FakeEngine engine;
  MemoryStore store;
  JobManager m(Options(engine, store));
  const std::string first = m.Submit("a", Spec("a")).value().id, second = m.Submit("b", Spec("b")).value().id;
  WaitFor(m, first, [](const JobRecord& r) { return r.state == JobState::kPreparing; });
  EXPECT_EQ(m.Cancel(second).value().state, JobState::kCancelled);
  EXPECT_EQ(store.Record(second).state, JobState::kCancelled);  // on disk before it was shown
  EXPECT_EQ(m.Cancel(first).value().state, JobState::kPreparing);
  EXPECT_EQ(WaitFinal(m, first).state, JobState::kCancelled);
  EXPECT_EQ(m.Cancel(first).value().state, JobState::kCancelled);  // idempotent
  EXPECT_EQ(engine.started(), std::vector<std::string>{"a"});
  EXPECT_EQ(m.Cancel("job-999999").status().code(), StatusCode::kNotFound);
}

TEST(JobManager, ShutdownSuspendsTheRunningJobAndTheNextStartResumesIt) {
  FakeEngine engine;
  engine.scripts["a"] = {10, Status::Ok()};
  MemoryStore store;
  std::string id;
  {
    JobManager m(Options(engine, store));
    id = m.Submit("a", Spec("a")).value().id;
    engine.Open(4);
    WaitFor(m, id, [](const JobRecord& r) { return r.step == 4; });
    m.Shutdown();
  }
  EXPECT_EQ(store.Record(id).state, JobState::kQueued);
  engine.resume_steps["/ckpt/" + id] = 4;
  JobManager again(Options(engine, store));
  EXPECT_EQ(again.Get(id).value().step, 4);
  const auto logs = Logs(again, id);
  EXPECT_NE(
      std::find(logs.begin(), logs.end(), "daemon restarted: queued again; resumes from the checkpoint at step 4"),
      logs.end());
  EXPECT_EQ(again.Get(id).value().interrupted_runs, 0);  // a clean stop is no interruption
  engine.Open();
  EXPECT_EQ(WaitFinal(again, id).state, JobState::kSucceeded);
}

// Queued again, or already taken by the engine thread (the fake's gate holds it before its first step).
bool Resumed(JobState s) { return s == JobState::kQueued || s == JobState::kPreparing; }

// A job the daemon died under (its record says RUNNING at the start) is resumed, but only while runs make
// progress: past max_interrupted_runs in a row without a newer checkpoint it fails with the reason.
TEST(JobManager, AJobInterruptedTooOftenWithoutProgressFailsAtTheStart) {
  FakeEngine engine;
  MemoryStore store;
  JobRecord r;
  r.id = "job-000001";
  r.name = "oom";
  r.spec = Spec("oom");
  r.state = JobState::kRunning;
  r.interrupted_runs = 2;
  r.interrupted_at_step = 0;
  store.Put(r);
  {
    JobManager m(WithMaxInterruptedRuns(Options(engine, store), 3));
    EXPECT_TRUE(Resumed(m.Get(r.id).value().state));
    EXPECT_EQ(m.Get(r.id).value().interrupted_runs, 3);
  }
  r.state = JobState::kRunning;  // ... and it died again
  r.interrupted_runs = 3;
  store.Put(r);
  {
    JobManager m(WithMaxInterruptedRuns(Options(engine, store), 3));
    const JobRecord failed = m.Get(r.id).value();
    EXPECT_EQ(failed.state, JobState::kFailed);
    EXPECT_NE(failed.error.find("4 times in a row without a new checkpoint"), std::string::npos) << failed.error;
    EXPECT_EQ(store.Record(r.id).state, JobState::kFailed);
  }
  // Progress (a newer checkpoint than at the last interruption) starts the count again.
  r.state = JobState::kRunning;
  r.interrupted_runs = 3;
  store.Put(r);
  engine.resume_steps["/ckpt/" + r.id] = 50;
  JobManager m(WithMaxInterruptedRuns(Options(engine, store), 3));
  EXPECT_TRUE(Resumed(m.Get(r.id).value().state));
  EXPECT_EQ(m.Get(r.id).value().interrupted_runs, 1);
  EXPECT_EQ(m.Get(r.id).value().interrupted_at_step, 50);
}

// Deleting a finished job's checkpoints (100 GB at 8B) used to happen under the table's lock: every GetJob,
// ListJobs and WatchJob waited behind it. The removal now runs on the store's thread.
TEST(JobManager, ListingIsNotHeldUpWhileAFinishedJobsCheckpointsAreRemoved) {
  FakeEngine engine;
  MemoryStore store;
  store.remove_delay = std::chrono::milliseconds(3000);
  JobManager m(Options(engine, store));
  const std::string id = m.Submit("a", Spec("a")).value().id;
  engine.Open();
  EXPECT_EQ(WaitFinal(m, id).state, JobState::kSucceeded);
  double slowest = 0;
  for (int i = 0; i < 20; ++i) {
    const auto t0 = Clock::now();
    EXPECT_EQ(m.List(std::nullopt).size(), 1u);
    EXPECT_TRUE(m.Get(id).ok());
    slowest = std::max(slowest, std::chrono::duration<double>(Clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(store.removals, 0);  // still removing: the reads above overlapped it
  EXPECT_LT(slowest, 1.0);
  std::printf("JOB_MANAGER slowest List+Get during a 3 s checkpoint removal: %.6f s\n", slowest);
  m.Shutdown();  // waits for the store's writes
  EXPECT_EQ(store.removals, 1);
}

// A job is shown finished only once its final record is written; while the store refuses, it stays in its
// running state with a log line, and the write is retried.
TEST(JobManager, AFinalRecordTheStoreRefusesIsRetriedBeforeTheEndIsShown) {
  FakeEngine engine;
  engine.scripts["a"] = {2, Status::Ok()};
  MemoryStore store;
  JobManager m(Options(engine, store));
  const std::string id = m.Submit("a", Spec("a")).value().id;
  engine.Open(1);
  WaitFor(m, id, [](const JobRecord& r) { return r.step == 1; });
  store.refuse_writes = true;
  engine.Open();
  const JobRecord waiting = WaitFor(m, id, [&](const JobRecord&) {
    const auto logs = Logs(m, id);
    return !logs.empty() && logs.back().find("waiting for the state directory") != std::string::npos;
  });
  EXPECT_EQ(waiting.state, JobState::kRunning);
  store.refuse_writes = false;
  EXPECT_EQ(WaitFinal(m, id).state, JobState::kSucceeded);
  EXPECT_EQ(store.Record(id).state, JobState::kSucceeded);
}

TEST(JobManager, ASubmissionWhoseRecordCannotBeWrittenOrPlannedIsRefused) {
  FakeEngine engine;
  MemoryStore store;
  JobManager m(Options(engine, store));
  store.refuse_writes = true;
  auto r = m.Submit("a", Spec("a"));
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("cannot record the job"), std::string::npos);
  store.refuse_writes = false;
  engine.plan_status = ResourceExhausted("needs 30 GiB, 24 GiB available");
  EXPECT_EQ(m.Submit("b", Spec("b")).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(m.List(std::nullopt).empty());
  EXPECT_EQ(m.Submit(std::string(129, 'n'), Spec("c")).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace slide
