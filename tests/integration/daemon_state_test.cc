// The daemon's durable state, configuration, security and metrics, with the real slided binary:
// kill -9 and SIGTERM restarts resume from checkpoints; a corrupt checkpoint fails only its job; bad config
// and missing tokens are refused; job paths stay inside the allowed roots; a real Prometheus server scrapes
// /metrics; 50 watchers and 1,000 reads while a job trains.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "slide/v1/slide.grpc.pb.h"
#include "tests/integration/daemon_calls.h"
#include "tests/integration/daemon_process.h"

namespace {

namespace v1 = slide::v1;
namespace fs = std::filesystem;
using slide::testing::Daemon;
using slide::testing::DaemonOptions;
using slide::testing::DemoJobSpec;
using slide::testing::Events;
using slide::testing::Get;
using slide::testing::Health;
using slide::testing::HttpGet;
using slide::testing::Submit;
using slide::testing::WaitFor;

// The step after the "resumed from the checkpoint at step N" log line, and the steps reported after it.
struct Resume {
  int64_t from = -1;
  std::vector<int64_t> steps_after;
  std::vector<int64_t> steps_before;
  std::vector<bool> replayed_after;  // the replayed mark of each of steps_after
  std::string restart_log;           // the daemon's "restarted" line
};
Resume ReadResume(const std::vector<v1::JobEvent>& events) {
  Resume r;
  for (const auto& e : events) {
    if (e.has_log() && e.log().rfind("resumed from the checkpoint at step ", 0) == 0)
      r.from = std::stoll(e.log().substr(std::string("resumed from the checkpoint at step ").size()));
    if (e.has_log() && e.log().rfind("daemon restarted", 0) == 0) r.restart_log = e.log();
    if (!e.has_metrics()) continue;
    (r.from < 0 ? r.steps_before : r.steps_after).push_back(e.metrics().step());
    if (r.from >= 0) r.replayed_after.push_back(e.metrics().replayed());
  }
  return r;
}

TEST(DaemonState, KillDashNineResumesFromTheLastCheckpoint) {
  Daemon first;
  v1::JobSpec spec = DemoJobSpec(first.Path("export"), 40);
  spec.set_checkpoint_every(5);
  const std::string id = Submit(first, spec);
  ASSERT_FALSE(id.empty());
  const v1::Job seen = WaitFor(
      first, id, [](const v1::Job& j) { return j.step() >= 12; }, 120);
  ASSERT_GE(seen.step(), 12);
  first.Kill();
  const int64_t before_kill = seen.step();

  Daemon second(DaemonOptions{.state_dir = first.state_dir()});
  ASSERT_GT(second.port(), 0) << second.Log();
  grpc::ClientContext c;
  v1::ListJobsRequest lr;
  v1::ListJobsResponse list;
  ASSERT_TRUE(second.stub().ListJobs(&c, lr, &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).id(), id);
  const int64_t listed_after_restart = list.jobs(0).step();

  const v1::Job done = WaitFor(
      second, id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 300);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.error();
  EXPECT_EQ(done.step(), 40);
  const Resume r = ReadResume(Events(second, id));
  // The checkpoint every 5 steps: at most 5 steps are redone, and the count continues from the checkpoint.
  ASSERT_GE(r.from, 10);
  EXPECT_EQ(r.from % 5, 0);
  EXPECT_GE(r.from, before_kill - 5);
  ASSERT_FALSE(r.steps_after.empty());
  for (size_t i = 0; i < r.steps_after.size(); ++i) EXPECT_EQ(r.steps_after[i], r.from + 1 + int64_t(i));
  EXPECT_EQ(r.steps_after.back(), 40);
  // The events from before the kill survived it (durable tail).
  EXPECT_GE(static_cast<int64_t>(r.steps_before.size()), before_kill - 1);
  // Progress went back to the checkpoint; the steps run a second time are marked replayed, the rest are not.
  const int64_t reached = *std::max_element(r.steps_before.begin(), r.steps_before.end());
  EXPECT_NE(r.restart_log.find("resumes from the checkpoint at step " + std::to_string(r.from)), std::string::npos)
      << r.restart_log;
  EXPECT_GE(listed_after_restart, r.from);
  EXPECT_LE(listed_after_restart, reached);
  if (reached > r.from)
    EXPECT_NE(r.restart_log.find("steps " + std::to_string(r.from + 1) + ".." + std::to_string(reached) +
                                 " run again and are marked replayed"),
              std::string::npos)
        << r.restart_log;
  for (size_t i = 0; i < r.steps_after.size(); ++i)
    EXPECT_EQ(r.replayed_after[i], r.steps_after[i] <= reached) << "step " << r.steps_after[i];
  EXPECT_TRUE(fs::exists(done.export_dir() + "/model.safetensors"));
  // Removed after success, on the store's thread (after SUCCEEDED is shown): within a few seconds.
  const std::string checkpoint = second.state_dir() + "/jobs/" + id + "/checkpoint";
  for (int i = 0; i < 300 && fs::exists(checkpoint); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(fs::exists(checkpoint));

  // Watching from a step skips the metrics of earlier steps.
  grpc::ClientContext wc;
  v1::WatchJobRequest from;
  from.set_id(id);
  from.set_from_step(38);
  auto reader = second.stub().WatchJob(&wc, from);
  std::vector<int64_t> steps;
  for (v1::JobEvent e; reader->Read(&e);)
    if (e.has_metrics()) steps.push_back(e.metrics().step());
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(steps, (std::vector<int64_t>{38, 39, 40}));
}

TEST(DaemonState, CancelStopsARunningJobAtAStepBoundary) {
  Daemon d;
  const std::string id = Submit(d, DemoJobSpec(d.Path("export"), 500));
  ASSERT_GE(WaitFor(
                d, id, [](const v1::Job& j) { return j.step() >= 2; }, 120)
                .step(),
            2);
  grpc::ClientContext c;
  v1::CancelJobRequest req;
  req.set_id(id);
  v1::CancelJobResponse resp;
  ASSERT_TRUE(d.stub().CancelJob(&c, req, &resp).ok());
  const v1::Job done = WaitFor(
      d, id, [](const v1::Job& j) { return j.state() == v1::CANCELLED; }, 60);
  ASSERT_EQ(done.state(), v1::CANCELLED);
  EXPECT_LT(done.step(), 500);
  EXPECT_EQ(done.error(), "cancelled at step " + std::to_string(done.step()));
  EXPECT_FALSE(fs::exists(d.Path("export") + "/model.safetensors"));
  grpc::ClientContext again;  // idempotent
  EXPECT_TRUE(d.stub().CancelJob(&again, req, &resp).ok());
  EXPECT_EQ(resp.job().state(), v1::CANCELLED);
}

TEST(DaemonState, SigtermCheckpointsTheRunningJobAndTheNextStartResumesIt) {
  Daemon first;
  v1::JobSpec spec = DemoJobSpec(first.Path("export"), 30);
  spec.set_checkpoint_every(1000);  // only the shutdown checkpoint
  const std::string id = Submit(first, spec);
  ASSERT_GE(WaitFor(
                first, id, [](const v1::Job& j) { return j.step() >= 3; }, 120)
                .step(),
            3);
  EXPECT_EQ(first.Terminate(30), 0) << first.Log();

  Daemon second(DaemonOptions{.state_dir = first.state_dir()});
  const v1::Job done = WaitFor(
      second, id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 300);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.error();
  const Resume r = ReadResume(Events(second, id));
  ASSERT_GE(r.from, 3);
  ASSERT_FALSE(r.steps_after.empty());
  EXPECT_EQ(r.steps_after.front(), r.from + 1);  // nothing lost, nothing done twice
  EXPECT_EQ(r.steps_after.back(), 30);
}

TEST(DaemonState, CorruptCheckpointFailsOnlyItsJob) {
  Daemon first;
  v1::JobSpec spec = DemoJobSpec(first.Path("export"), 40);
  spec.set_checkpoint_every(2);
  const std::string id = Submit(first, spec);
  const int64_t before_kill = WaitFor(
                                  first, id, [](const v1::Job& j) { return j.step() >= 5; }, 120)
                                  .step();
  ASSERT_GE(before_kill, 5);
  first.Kill();
  const std::string ckpt = first.state_dir() + "/jobs/" + id + "/checkpoint";
  std::string latest;
  std::ifstream(ckpt + "/LATEST") >> latest;
  const std::string tensors = ckpt + "/" + latest + "/optimizer.safetensors";
  ASSERT_TRUE(fs::exists(tensors));
  std::ofstream(tensors, std::ios::trunc) << "not a safetensors file";

  Daemon second(DaemonOptions{.state_dir = first.state_dir()});
  const v1::Job failed = WaitFor(
      second, id, [](const v1::Job& j) { return j.state() == v1::FAILED; }, 120);
  ASSERT_EQ(failed.state(), v1::FAILED);
  EXPECT_NE(failed.error().find("DATA_LOSS"), std::string::npos) << failed.error();
  EXPECT_NE(failed.error().find(tensors), std::string::npos) << failed.error();
  // The progress shown is where the job would resume, the checkpoint LATEST names, not the step it had reached.
  const int64_t checkpoint_step = std::stoll(latest.substr(std::string("step-").size()));
  EXPECT_EQ(failed.step(), checkpoint_step);
  EXPECT_EQ(Health(second), grpc::health::v1::HealthCheckResponse::SERVING);
  const std::string next = Submit(second, DemoJobSpec(second.Path("export2"), 3));
  EXPECT_EQ(WaitFor(
                second, next, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 120)
                .state(),
            v1::SUCCEEDED);
}

// Bad bytes in a job's files fail that job without taking the daemon down, and its error (quoting them) is
// stored and read back. An unreadable record is skipped at start and its id is not reused; a torn last event
// line (kill -9 mid-append) is cut off so later appends stay readable.
TEST(DaemonState, DamagedFilesNeverTakeTheDaemonDown) {
  Daemon first;
  const fs::path model = first.Path("model");
  fs::copy(std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/model", model);
  { std::ofstream(model / "tokenizer.json", std::ios::trunc) << "{\"model\": \xff\xfe broken"; }
  v1::JobSpec bad = DemoJobSpec(first.Path("export-bad"), 3);
  bad.set_model_dir(model.string());
  const std::string bad_id = Submit(first, bad);
  const v1::Job failed = WaitFor(
      first, bad_id, [](const v1::Job& j) { return j.state() == v1::FAILED; }, 60);
  ASSERT_EQ(failed.state(), v1::FAILED);
  EXPECT_NE(failed.error().find("tokenizer.json"), std::string::npos) << failed.error();
  EXPECT_EQ(Health(first), grpc::health::v1::HealthCheckResponse::SERVING);
  const std::string good_id = Submit(first, DemoJobSpec(first.Path("export"), 3));
  ASSERT_EQ(WaitFor(
                first, good_id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 60)
                .state(),
            v1::SUCCEEDED);
  EXPECT_EQ(first.Terminate(30), 0);

  const std::string jobs = first.state_dir() + "/jobs/";
  std::ofstream(jobs + good_id + "/record.json", std::ios::trunc) << "{";                 // unreadable
  std::ofstream(jobs + bad_id + "/events.jsonl", std::ios::app) << "{\"seq\": 99, \"lo";  // torn
  {
    Daemon second(DaemonOptions{.state_dir = first.state_dir()});
    ASSERT_GT(second.port(), 0) << second.Log();
    EXPECT_NE(second.Log().find("skipped unreadable job state: " + jobs + good_id + "/record.json"), std::string::npos)
        << second.Log();
    EXPECT_EQ(second.Log().find("events.jsonl"), std::string::npos) << second.Log();
    EXPECT_EQ(Get(second, bad_id).state(), v1::FAILED);
    EXPECT_EQ(Get(second, bad_id).error(), failed.error());  // the bad byte is U+FFFD in both
    const std::string next = Submit(second, DemoJobSpec(second.Path("export"), 2));
    EXPECT_NE(next, good_id);  // the unreadable job's id stays its own
    EXPECT_GT(next, good_id);
    EXPECT_EQ(second.Terminate(30), 0);
  }
  Daemon third(DaemonOptions{.state_dir = first.state_dir()});  // the appends after the trim read back cleanly
  ASSERT_GT(third.port(), 0) << third.Log();
  EXPECT_EQ(third.Log().find("events.jsonl"), std::string::npos) << third.Log();
  EXPECT_FALSE(Events(third, bad_id).empty());
}

// The store keeps the API's own messages as proto JSON: record.json is the slide.v1.Job GetJob serves (the full
// spec, defaults filled in), each events.jsonl line a slide.v1.JobEvent; a restarted daemon serves the same job.
TEST(DaemonState, TheStoreHoldsTheApisMessagesAsProtoJson) {
  using google::protobuf::util::MessageDifferencer;
  auto parse = [](const std::string& text, google::protobuf::Message* m) {
    return google::protobuf::util::JsonStringToMessage(text, m).ok();
  };
  Daemon first;
  ASSERT_GT(first.port(), 0) << first.Log();
  const std::string id = Submit(first, DemoJobSpec(first.Path("export"), 2));
  ASSERT_EQ(WaitFor(
                first, id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 60)
                .state(),
            v1::SUCCEEDED);
  const v1::Job served = Get(first, id);
  EXPECT_EQ(served.spec().adam_beta2(), 0.95);  // defaults the request left out are part of the spec
  EXPECT_EQ(served.spec().log_every(), 1);
  EXPECT_EQ(served.spec().lr_schedule(), v1::LR_SCHEDULE_COSINE);
  EXPECT_EQ(first.Terminate(30), 0);

  const std::string dir = first.state_dir() + "/jobs/" + id;
  std::stringstream record;
  record << std::ifstream(dir + "/record.json").rdbuf();
  v1::Job stored;
  ASSERT_TRUE(parse(record.str(), &stored)) << record.str();
  EXPECT_TRUE(MessageDifferencer::Equals(stored, served)) << stored.DebugString() << served.DebugString();
  std::ifstream events(dir + "/events.jsonl");
  int metrics = 0, lines = 0;
  for (std::string line; std::getline(events, line); ++lines) {
    v1::JobEvent e;
    ASSERT_TRUE(parse(line, &e)) << line;
    EXPECT_EQ(e.seq(), lines + 1);
    metrics += e.has_metrics();
  }
  EXPECT_EQ(metrics, 2);

  Daemon second(DaemonOptions{.state_dir = first.state_dir()});
  ASSERT_GT(second.port(), 0) << second.Log();
  EXPECT_TRUE(MessageDifferencer::Equals(Get(second, id), served));
  EXPECT_EQ(static_cast<int>(Events(second, id).size()), lines);
}

// A state directory written before the store kept slide.v1.Job (3b5b7b6's format: the name beside the spec, the
// dataset as dataset_path, a diverged loss as null) still loads whole.
TEST(DaemonState, RecordsOfTheEarlierFormatStillLoad) {
  const fs::path state = fs::temp_directory_path() / ("slided-legacy-" + std::to_string(getpid()));
  fs::create_directories(state / "jobs" / "job-000007");
  std::ofstream(state / "jobs" / "job-000007" / "record.json")
      << R"({"created_unix_ms": 1764770000000, "error": "", "eval_loss": -1.0, "export_dir": "/out/x",
            "finished_unix_ms": 1764770060000, "id": "job-000007", "loss": null, "name": "old-job",
            "spec": {"batch_size": 4, "dataset_path": "/data/train.jsonl", "model_dir": "/models/m",
                     "output_dir": "/out", "steps": 3, "lr_schedule": "linear", "checkpoint_dir": "/gone",
                     "seed": 11}, "state": "SUCCEEDED", "step": 3, "total_steps": 3})";
  std::ofstream(state / "jobs" / "job-000007" / "events.jsonl")
      << R"({"seq": 1, "state": "RUNNING"})"
      << "\n"
      << R"({"seq": 2, "metrics": {"step": 3, "total_steps": 3, "loss": 2.5, "bounded_by": "cpu_update"}})"
      << "\n";
  Daemon d(DaemonOptions{.state_dir = state.string()});
  ASSERT_GT(d.port(), 0) << d.Log();
  EXPECT_EQ(d.Log().find("skipped"), std::string::npos) << d.Log();
  const v1::Job job = Get(d, "job-000007");
  EXPECT_EQ(job.state(), v1::SUCCEEDED);
  EXPECT_EQ(job.spec().name(), "old-job");
  EXPECT_EQ(job.spec().dataset(), "/data/train.jsonl");
  EXPECT_EQ(job.spec().model_dir(), "/models/m");
  EXPECT_EQ(job.spec().lr_schedule(), v1::LR_SCHEDULE_LINEAR);  // a short name then
  EXPECT_EQ(job.spec().batch_size(), 4);
  EXPECT_EQ(job.spec().seed(), 11u);
  EXPECT_EQ(job.export_dir(), "/out/x");
  EXPECT_EQ(job.loss(), 2.5);  // progress comes from the newest metrics event
  EXPECT_EQ(Events(d, "job-000007").size(), 2u);
  EXPECT_EQ(d.Terminate(30), 0);
  fs::remove_all(state);
}

TEST(DaemonState, JobsTooLargeOrOutsideTheRootsAreRefusedAtSubmission) {
  const fs::path root = fs::temp_directory_path() / ("slided-roots-" + std::to_string(getpid()));
  fs::create_directories(root / "jobs");
  fs::create_symlink(std::string(SLIDE_SOURCE_DIR) + "/deploy/demo", root / "jobs" / "escape");
  const std::string config = (root / "slided.yaml").string();
  std::ofstream(config) << "security:\n  allowed_roots: [" << (root / "jobs").string() << "]\n";
  Daemon d(DaemonOptions{.extra_args = {"--config", config}});
  ASSERT_GT(d.port(), 0) << d.Log();

  grpc::Status s;
  Submit(d, DemoJobSpec((root / "jobs" / "out").string(), 3), &s);  // the model lies outside the root
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("job field 'model_dir'"), std::string::npos) << s.error_message();
  v1::JobSpec via_link = DemoJobSpec((root / "jobs" / "out").string(), 3);
  via_link.set_model_dir((root / "jobs" / "escape" / "model").string());  // a symlink out of the root
  via_link.set_dataset((root / "jobs" / "escape" / "train.jsonl").string());
  Submit(d, via_link, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("outside the allowed roots"), std::string::npos) << s.error_message();

  Daemon open;
  v1::JobSpec big = DemoJobSpec(open.Path("export"), 3);
  big.set_gpu_budget_bytes(1 << 16);
  Submit(open, big, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("the device budget is"), std::string::npos) << s.error_message();
  EXPECT_EQ(Health(open), grpc::health::v1::HealthCheckResponse::SERVING);
  std::error_code ec;
  fs::remove_all(root, ec);
}

TEST(DaemonState, BadConfigStopsTheStartWithTheFieldAndTcpGetsAGeneratedToken) {
  const fs::path dir = fs::temp_directory_path() / ("slided-config-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string bad = (dir / "bad.yaml").string();
  std::ofstream(bad) << "server:\n  listne: 127.0.0.1:1\n";
  Daemon a(DaemonOptions{.extra_args = {"--config", bad}, .wait_for_port = false});
  EXPECT_EQ(a.WaitExit(20), 2);
  EXPECT_NE(a.Log().find(bad + ":2:3: server.listne: unknown key"), std::string::npos) << a.Log();

  const std::string wrong_type = (dir / "type.yaml").string();
  std::ofstream(wrong_type) << "jobs:\n  checkpoint_every: often\n";
  Daemon b(DaemonOptions{.extra_args = {"--config", wrong_type}, .wait_for_port = false});
  EXPECT_EQ(b.WaitExit(20), 2);
  EXPECT_NE(b.Log().find("jobs.checkpoint_every: wrong type"), std::string::npos) << b.Log();

  const std::string odd_key = (dir / "key.yaml").string();
  std::ofstream(odd_key) << "server:\n  [a]: 1\n";
  Daemon k(DaemonOptions{.extra_args = {"--config", odd_key}, .wait_for_port = false});
  EXPECT_EQ(k.WaitExit(20), 2);
  EXPECT_NE(k.Log().find(odd_key + ":2:3: server: a key must be text"), std::string::npos) << k.Log();

  // Beyond loopback without a configured token: one is generated into the state directory (owner-only), and the
  // log says where; the daemon never listens on TCP without one.
  Daemon c(DaemonOptions{.extra_args = {"--listen", "0.0.0.0:0"}});
  ASSERT_GT(c.port(), 0) << c.Log();
  EXPECT_NE(c.Log().find("generated one into " + c.state_dir() + "/token"), std::string::npos) << c.Log();
  EXPECT_EQ(c.token().size(), 64u);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(DaemonState, EveryCallNeedsTheTokenWhenOneIsSet) {
  Daemon d(DaemonOptions{.token_env = "s3cret-token"});
  ASSERT_GT(d.port(), 0) << d.Log();
  auto status_with = [&](const std::string& token) {
    grpc::ClientContext c;
    if (!token.empty()) c.AddMetadata("authorization", "Bearer " + token);
    v1::GetServerStatusRequest r;
    v1::ServerStatus s;
    return d.stub().GetServerStatus(&c, r, &s);
  };
  EXPECT_EQ(status_with("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status_with("s3cret-tokeN").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(status_with("s3cret-token").ok());
  grpc::Status submit;
  Submit(d, DemoJobSpec(d.Path("export"), 2), &submit);
  EXPECT_EQ(submit.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Health(d), grpc::health::v1::HealthCheckResponse::SERVING);  // health stays open to probes
}

// --- Prometheus -------------------------------------------------------------------------------------------

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

TEST(DaemonState, RealPrometheusScrapesTheStepCounter) {
  const char* prometheus = "/usr/bin/prometheus";
  if (!fs::exists(prometheus)) GTEST_SKIP() << "Debian's prometheus package is not installed";
  Daemon d;
  ASSERT_GT(d.metrics_port(), 0) << d.Log();
  const std::string id = Submit(d, DemoJobSpec(d.Path("export"), 12));
  ASSERT_EQ(WaitFor(
                d, id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 120)
                .state(),
            v1::SUCCEEDED);
  const std::string text = HttpGet(d.metrics_port(), "/metrics");
  EXPECT_NE(text.find("slide_steps_total 12"), std::string::npos) << text;
  EXPECT_NE(text.find("slide_jobs{state=\"SUCCEEDED\"} 1"), std::string::npos) << text;
  // The Grafana dashboard and the alert rules in deploy/ use only metrics the daemon exports (and the alert
  // rules only label values it exports).
  auto read = [](const std::string& path) {
    std::ifstream f(std::string(SLIDE_SOURCE_DIR) + path);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  auto check_names = [&](const std::string& what, const std::string& doc, bool labels) {
    int names = 0;
    for (size_t at = doc.find("slide_"); at != std::string::npos; at = doc.find("slide_", at + 1)) {
      size_t end = at;
      while (end < doc.size() && (std::islower(static_cast<unsigned char>(doc[end])) || doc[end] == '_')) ++end;
      const std::string name = doc.substr(at, end - at);
      ++names;
      EXPECT_TRUE(text.find("\n" + name + " ") != std::string::npos ||
                  text.find("\n" + name + "{") != std::string::npos)
          << what << " uses " << name << ", which /metrics does not have";
      if (labels && end < doc.size() && doc[end] == '{') {
        const std::string selector = doc.substr(end, doc.find_first_of(",}", end) - end) + "}";
        EXPECT_NE(text.find("\n" + name + selector), std::string::npos)
            << what << " selects " << name << selector << ", which /metrics does not have";
      }
    }
    return names;
  };
  EXPECT_GE(check_names("the dashboard", read("/deploy/grafana/slideformer.json"), false), 15);
  EXPECT_GE(check_names("the alert rules", read("/deploy/prometheus/alerts.yml"), true), 8);

  const fs::path dir = d.Path("prometheus");
  fs::create_directories(dir);
  std::ofstream(dir / "prometheus.yml") << "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: slided\n"
                                        << "    static_configs:\n      - targets: ['127.0.0.1:" << d.metrics_port()
                                        << "']\n";
  const int web = FreePort();
  const pid_t pid = fork();
  if (pid == 0) {
    if (std::freopen((dir / "prometheus.log").c_str(), "w", stderr) == nullptr) _exit(126);
    const std::string cfg = "--config.file=" + (dir / "prometheus.yml").string();
    const std::string data = "--storage.tsdb.path=" + (dir / "data").string();
    const std::string addr = "--web.listen-address=127.0.0.1:" + std::to_string(web);
    execl(prometheus, prometheus, cfg.c_str(), data.c_str(), addr.c_str(), nullptr);
    _exit(127);
  }
  std::string answer;
  for (int i = 0; i < 120; ++i) {  // up to 60 s: start-up plus the first scrapes
    answer = HttpGet(web, "/api/v1/query?query=slide_steps_total");
    if (answer.find("\"value\":[") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  EXPECT_NE(answer.find("\"__name__\":\"slide_steps_total\""), std::string::npos) << answer;
  EXPECT_NE(answer.find(",\"12\"]"), std::string::npos) << answer;
}

// --- Load -------------------------------------------------------------------------------------------------

TEST(DaemonState, FiftyWatchersAndAThousandReadsWhileAJobTrains) {
  Daemon d;
  const std::string id = Submit(d, DemoJobSpec(d.Path("export"), 80));
  ASSERT_FALSE(id.empty());
  const int64_t load_from = WaitFor(
                                d, id, [](const v1::Job& j) { return j.step() >= 15; }, 120)
                                .step();
  std::atomic<int> watch_errors{0}, read_errors{0}, finished_watchers{0};
  // 10 ms between a reader's calls spreads the 1,000 calls over ~3 s (SLIDE_LOAD_PACE_MS for longer steps).
  const int pace_ms = std::getenv("SLIDE_LOAD_PACE_MS") != nullptr ? std::atoi(std::getenv("SLIDE_LOAD_PACE_MS")) : 10;
  std::vector<std::thread> watchers;
  for (int w = 0; w < 50; ++w)
    watchers.emplace_back([&] {
      grpc::ClientContext c;
      c.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
      v1::WatchJobRequest req;
      req.set_id(id);
      auto reader = d.stub().WatchJob(&c, req);
      v1::JobEvent e;
      v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
      while (reader->Read(&e))
        if (e.kind_case() == v1::JobEvent::kState) last = e.state();
      if (!reader->Finish().ok() || last != v1::SUCCEEDED) ++watch_errors;
      ++finished_watchers;
    });
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t)
    readers.emplace_back([&, t] {
      for (int i = 0; i < 250; ++i) {
        grpc::ClientContext c;
        grpc::Status s;
        if ((i + t) % 2 == 0) {
          v1::GetJobRequest g;
          g.set_id(id);
          v1::GetJobResponse r;
          s = d.stub().GetJob(&c, g, &r);
        } else {
          v1::ListJobsRequest l;
          v1::ListJobsResponse r;
          s = d.stub().ListJobs(&c, l, &r);
        }
        if (!s.ok()) ++read_errors;
        std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));  // spread over the training
      }
    });
  for (auto& t : readers) t.join();
  const int64_t reads_until = Get(d, id).step();
  for (auto& t : watchers) t.join();
  EXPECT_EQ(read_errors.load(), 0);
  EXPECT_EQ(watch_errors.load(), 0);
  EXPECT_EQ(finished_watchers.load(), 50);
  EXPECT_EQ(Get(d, id).state(), v1::SUCCEEDED);
  // The figure (not a timed assertion): median step time before the load and while the 1,000 reads ran.
  std::vector<double> quiet, loaded;
  for (const auto& e : Events(d, id)) {
    if (!e.has_metrics() || e.metrics().step() < 3) continue;  // the first steps warm up
    if (e.metrics().step() <= load_from) quiet.push_back(e.metrics().step_seconds());
    if (e.metrics().step() > load_from + 1 && e.metrics().step() <= reads_until)
      loaded.push_back(e.metrics().step_seconds());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf("LOAD median step %.4f s quiet (%zu steps), %.4f s under 50 watchers + 1000 reads (%zu steps): %+.1f%%\n",
              median(quiet), quiet.size(), median(loaded), loaded.size(),
              100.0 * (median(loaded) / median(quiet) - 1.0));
}

// The log: every line carries a UTC time with milliseconds and a level (or continues the line above, indented);
// a job's transitions are info lines, its own log lines debug lines; --log-level drops what is below it; a bad
// level refuses to start, naming the field.
TEST(DaemonState, LogLinesCarryTimeAndLevel) {
  const std::regex stamped(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO |WARN |ERROR) \S.*)");
  {
    DaemonOptions o;
    o.extra_args = {"--log-level", "debug"};
    Daemon d(o);
    const std::string id = Submit(d, DemoJobSpec(d.Path("export"), 2));
    ASSERT_EQ(WaitFor(
                  d, id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 120)
                  .state(),
              v1::SUCCEEDED)
        << d.Log();
    const std::string log = d.Log();
    std::istringstream in(log);
    int stamped_lines = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("    ", 0) == 0) continue;  // the continuation of a multi-line message
      EXPECT_TRUE(std::regex_match(line, stamped)) << "unstamped log line: " << line;
      ++stamped_lines;
    }
    EXPECT_GE(stamped_lines, 4) << log;
    EXPECT_NE(log.find("Z INFO  serving on " + d.addr() + " (owner-only socket)"), std::string::npos) << log;
    EXPECT_NE(log.find("Z INFO  job " + id + " (demo) RUNNING"), std::string::npos) << log;
    EXPECT_NE(log.find("Z INFO  job " + id + " (demo) SUCCEEDED"), std::string::npos) << log;
    EXPECT_NE(log.find("Z DEBUG job " + id + ": "), std::string::npos) << log;
  }
  {
    DaemonOptions o;
    o.extra_args = {"--log-level", "warning"};
    Daemon d(o);
    const std::string id = Submit(d, DemoJobSpec(d.Path("export"), 1));
    WaitFor(
        d, id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 120);
    EXPECT_EQ(d.Log().find(" INFO "), std::string::npos) << d.Log();
  }
  {
    DaemonOptions o;
    o.extra_args = {"--log-level", "verbose"};
    o.wait_for_port = false;
    Daemon d(o);
    EXPECT_EQ(d.WaitExit(30), 2);
    EXPECT_NE(d.Log().find("config field 'server.log_level' must be debug, info, warning or error, not 'verbose'"),
              std::string::npos)
        << d.Log();
  }
}

}  // namespace
