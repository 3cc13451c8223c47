// What an outside test of the daemon found (issue: reliability and security), each through the real slided: jobs
// that would take the daemon down or make it crash-loop, results that were wrong but called success, writes where
// the daemon should not write, and service edges. After every case the daemon is SERVING and nothing committed to
// its state directory is lost.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "tests/integration/daemon_calls.h"
#include "tests/integration/daemon_process.h"

namespace {

namespace v1 = slide::v1;
namespace fs = std::filesystem;
using slide::testing::Contains;
using slide::testing::CopyDemoModel;
using slide::testing::Daemon;
using slide::testing::DaemonOptions;
using slide::testing::DemoJobSpec;
using slide::testing::Events;
using slide::testing::Get;
using slide::testing::Health;
using slide::testing::kDemo;
using slide::testing::Scratch;
using slide::testing::Submit;
using slide::testing::WaitFinal;
using slide::testing::WaitFor;
using Serving = grpc::health::v1::HealthCheckResponse;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteText(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// Replaces `"key": <old>` in a JSON text (config.json, record.json) by `"key": value`.
std::string WithJsonField(std::string text, const std::string& key, const std::string& value) {
  const std::string tag = "\"" + key + "\": ";
  const size_t at = text.find(tag);
  EXPECT_NE(at, std::string::npos) << key;
  if (at == std::string::npos) return text;
  const size_t end = text.find_first_of(",\n}", at + tag.size());
  return text.replace(at + tag.size(), end - at - tag.size(), value);
}

TEST(Reliability, HugeSizesAreRefusedAtSubmissionNamingTheField) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  auto refused = [&](v1::JobSpec spec, const std::string& part) {
    grpc::Status s;
    EXPECT_TRUE(Submit(d, spec, &s).empty()) << part;
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << part << ": " << s.error_message();
    EXPECT_TRUE(Contains(s.error_message(), part)) << s.error_message();
  };
  for (int64_t batch : {int64_t{1} << 55, int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    v1::JobSpec spec = DemoJobSpec(d.Path("out"), 2);
    spec.set_batch_size(batch);
    refused(spec, "job field 'batch_size' must be in [1, ");
  }
  for (int64_t epochs : {int64_t{0}, int64_t{-2}, int64_t{1} << 62}) {
    v1::JobSpec spec = DemoJobSpec(d.Path("out"), 0);
    spec.set_epochs(epochs);
    refused(spec, "job field 'epochs' must be in [1, ");
  }
  v1::JobSpec steps = DemoJobSpec(d.Path("out"), 0);
  steps.set_steps(int64_t{1} << 62);
  refused(steps, "job field 'steps' must be in [0, ");
  EXPECT_EQ(Health(d), Serving::SERVING);
}

// config.json dimensions beyond any model (num_hidden_layers 2^40 closed the connection: the daemon died
// planning it), a vocab_size of 2^63-1, and a config that claims more layers than its tensors hold: each refused
// at submission naming the file and the field.
TEST(Reliability, AbsurdModelConfigsAreRefusedNamingTheFileAndField) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  Scratch dir("configs");
  const std::string demo_config = ReadText(kDemo + "/model/config.json");
  auto refused = [&](const std::string& key, const std::string& value, grpc::StatusCode code, const std::string& part) {
    const fs::path model = dir / ("model-" + key + value.substr(0, 4));
    CopyDemoModel(model);
    WriteText(model / "config.json", WithJsonField(demo_config, key, value));
    v1::JobSpec spec = DemoJobSpec((dir / "out").string(), 2);
    spec.set_model_dir(model.string());
    grpc::Status s;
    EXPECT_TRUE(Submit(d, spec, &s).empty());
    EXPECT_EQ(s.error_code(), code) << key << ": " << s.error_message();
    EXPECT_TRUE(Contains(s.error_message(), (model / "config.json").string()) || Contains(s.error_message(), part))
        << s.error_message();
    EXPECT_TRUE(Contains(s.error_message(), part)) << s.error_message();
  };
  refused("num_hidden_layers", "1099511627776", grpc::StatusCode::INVALID_ARGUMENT,
          "field 'num_hidden_layers' must be in [1, 1024], got 1099511627776");
  refused("vocab_size", "9223372036854775807", grpc::StatusCode::INVALID_ARGUMENT,
          "field 'vocab_size' must be in [1, 16777216]");
  refused("num_hidden_layers", "40", grpc::StatusCode::INVALID_ARGUMENT, "checkpoint lacks");
  EXPECT_EQ(Health(d), Serving::SERVING);
}

// A job whose run kills the daemon (here: kill -9 while it runs, as the OOM killer would) is resumed after a
// restart, but not forever: past jobs.max_interrupted_runs restarts in a row without a new checkpoint it fails
// with the reason, and the daemon serves the jobs behind it.
TEST(Reliability, AJobTheDaemonKeepsDyingUnderFailsInsteadOfCrashLooping) {
  Scratch dir("crashloop");
  const std::string config = (dir / "slided.yaml").string();
  WriteText(config, "jobs:\n  max_interrupted_runs: 2\n");
  const std::string state = (dir / "state").string();
  std::string id;
  for (int run = 1; run <= 3; ++run) {
    Daemon d(DaemonOptions{.state_dir = state, .extra_args = {"--config", config}});
    ASSERT_GT(d.port(), 0) << d.Log();
    if (run == 1) {
      v1::JobSpec spec = DemoJobSpec((dir / "out").string(), 100000);
      spec.set_checkpoint_every(100000);  // no checkpoint: every restart makes no progress
      id = Submit(d, spec);
      ASSERT_FALSE(id.empty());
    }
    const v1::Job running = WaitFor(
        d, id, [](const v1::Job& j) { return j.step() >= 1; }, 120);
    ASSERT_EQ(running.state(), v1::RUNNING) << "run " << run << ": " << running.error();
    EXPECT_EQ(running.interrupted_runs(), run - 1);
    d.Kill();
  }
  Daemon d(DaemonOptions{.state_dir = state, .extra_args = {"--config", config}});
  ASSERT_GT(d.port(), 0) << d.Log();
  const v1::Job failed = Get(d, id);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.interrupted_runs(), 3);
  EXPECT_TRUE(Contains(failed.error(), "3 times in a row without a new checkpoint")) << failed.error();
  EXPECT_TRUE(Contains(failed.error(), "jobs.max_interrupted_runs is 2")) << failed.error();
  EXPECT_EQ(Health(d), Serving::SERVING);
  const std::string next = Submit(d, DemoJobSpec((dir / "out2").string(), 2));
  EXPECT_EQ(WaitFinal(d, next).state(), v1::SUCCEEDED);
  // Failed for good: the next start does not resume it either.
  d.Kill();
  Daemon again(DaemonOptions{.state_dir = state, .extra_args = {"--config", config}});
  ASSERT_GT(again.port(), 0) << again.Log();
  EXPECT_EQ(Get(again, id).state(), v1::FAILED);
}

// Two daemons on one state directory would both run its queue: the second refuses to start, naming the first.
TEST(Reliability, ASecondDaemonOnTheSameStateDirectoryRefusesToStart) {
  Daemon first;
  ASSERT_GT(first.port(), 0) << first.Log();
  Daemon second(DaemonOptions{.state_dir = first.state_dir(), .wait_for_port = false});
  EXPECT_EQ(second.WaitExit(20), 2) << second.Log();
  EXPECT_TRUE(Contains(second.Log(), "is in use by another slided (pid ")) << second.Log();
  EXPECT_EQ(Health(first), Serving::SERVING);
}

// A directory jobs/job-9223372036854775807 (made by hand, restored from elsewhere) must not make new ids wrap
// negative, and a job directory that exists without a record (a stray copy) keeps its id: no record is overwritten.
TEST(Reliability, JobIdsNeverWrapNorOverwriteARecord) {
  Scratch dir("ids");
  const std::string state = (dir / "state").string();
  std::string first_id, record;
  {
    Daemon d(DaemonOptions{.state_dir = state});
    ASSERT_GT(d.port(), 0) << d.Log();
    first_id = Submit(d, DemoJobSpec((dir / "out").string(), 2));
    ASSERT_EQ(WaitFinal(d, first_id).state(), v1::SUCCEEDED);
    d.Kill();
    record = ReadText(state + "/jobs/" + first_id + "/record.json");
  }
  const std::string huge = "job-9223372036854775807";
  fs::create_directories(state + "/jobs/" + huge);
  WriteText(state + "/jobs/" + huge + "/record.json", WithJsonField(record, "id", "\"" + huge + "\""));
  fs::create_directories(state + "/jobs/job-000002");  // stray, no record
  Daemon d(DaemonOptions{.state_dir = state});
  ASSERT_GT(d.port(), 0) << d.Log();
  EXPECT_EQ(Get(d, huge).id(), huge);
  const std::string next = Submit(d, DemoJobSpec((dir / "out2").string(), 2));
  EXPECT_EQ(next, "job-000003");
  EXPECT_EQ(ReadText(state + "/jobs/" + huge + "/record.json"), WithJsonField(record, "id", "\"" + huge + "\""));
  EXPECT_EQ(WaitFinal(d, next).state(), v1::SUCCEEDED);
}

// The defaults are safe on a shared machine: the API is a socket only the daemon's user can open in a state
// directory only it can enter; TCP is an opt-in that always needs a bearer token (generated, owner-only, when none
// is configured).
TEST(Reliability, DefaultsAreOwnerOnlyAndTcpAlwaysNeedsAToken) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  struct stat st {};
  ASSERT_EQ(::stat(d.socket_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(d.state_dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  Daemon tcp(DaemonOptions{.tcp = true});
  ASSERT_GT(tcp.port(), 0) << tcp.Log();
  const std::string token = tcp.token();
  EXPECT_EQ(token.size(), 64u);
  ASSERT_EQ(::stat((tcp.state_dir() + "/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto status_with = [&](const std::string& t) {
    grpc::ClientContext c;
    if (!t.empty()) c.AddMetadata("authorization", "Bearer " + t);
    v1::GetServerStatusRequest r;
    v1::ServerStatus s;
    return tcp.stub().GetServerStatus(&c, r, &s).error_code();
  };
  EXPECT_EQ(status_with(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status_with(token), grpc::StatusCode::OK);
  // The token is kept across restarts.
  tcp.Kill();
  Daemon again(DaemonOptions{.state_dir = tcp.state_dir(), .tcp = true});
  ASSERT_GT(again.port(), 0) << again.Log();
  EXPECT_EQ(again.token(), token);
}

// output_dir equal to model_dir overwrote the source model without a word; nested, or holding the dataset, too.
TEST(Reliability, OutputOverTheModelOrTheDataIsRefusedAtSubmission) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  Scratch dir("overlap");
  CopyDemoModel(dir / "model");
  const std::string before = ReadText(dir / "model/model.safetensors");
  v1::JobSpec spec = DemoJobSpec((dir / "model").string(), 2);
  spec.set_model_dir((dir / "model").string());
  grpc::Status s;
  EXPECT_TRUE(Submit(d, spec, &s).empty());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(Contains(s.error_message(), "job fields 'output_dir' ('" + (dir / "model").string() +
                                              "') and 'model_dir' ('" + (dir / "model").string() + "')"))
      << s.error_message();
  spec.set_output_dir(dir.str());
  EXPECT_TRUE(Submit(d, spec, &s).empty());
  EXPECT_TRUE(Contains(s.error_message(), "contain one another")) << s.error_message();
  EXPECT_EQ(ReadText(dir / "model/model.safetensors"), before);
  EXPECT_EQ(Health(d), Serving::SERVING);
}

// Page tokens are what ListJobs gave, nothing else; an unknown state filter is an error, not "every job".
TEST(Reliability, ListJobsParsesPageTokensAndStatesStrictly) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  for (int i = 0; i < 3; ++i) {
    v1::JobSpec spec = DemoJobSpec(d.Path("out" + std::to_string(i)), 1);
    ASSERT_FALSE(Submit(d, spec).empty());
  }
  auto list = [&](const std::string& token, int state, v1::ListJobsResponse* out) {
    grpc::ClientContext c;
    v1::ListJobsRequest r;
    r.set_page_token(token);
    r.set_page_size(2);
    r.set_state(static_cast<v1::JobState>(state));
    return d.stub().ListJobs(&c, r, out);
  };
  v1::ListJobsResponse page;
  ASSERT_TRUE(list("", 0, &page).ok());
  EXPECT_EQ(page.jobs_size(), 2);
  EXPECT_EQ(page.next_page_token(), "2");
  ASSERT_TRUE(list("2", 0, &page).ok());
  for (const std::string& bad :
       std::vector<std::string>{"5abc", " 7", "+7", "-1", "07", "1e3", std::string(1 << 20, '9')}) {
    const grpc::Status s = list(bad, 0, &page);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "'" << bad.substr(0, 20) << "'";
    EXPECT_LT(s.error_message().size(), 400u);
  }
  const grpc::Status s = list("", 99, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(Contains(s.error_message(), "state 99 is not a job state")) << s.error_message();
}

// A 20 KB job id quoted whole made the status exceed gRPC's metadata limit ("Stream removed"): the error quotes a
// bounded part and keeps its code.
TEST(Reliability, HugeIdsGetTheirOwnErrorWithABoundedQuote) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  const std::string id(20000, 'x');
  grpc::ClientContext c;
  v1::GetJobRequest g;
  g.set_id(id);
  v1::GetJobResponse r;
  grpc::Status s = d.stub().GetJob(&c, g, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message().substr(0, 200);
  EXPECT_TRUE(Contains(s.error_message(), "(20000 bytes)")) << s.error_message().substr(0, 200);
  grpc::ClientContext cc;
  v1::CancelJobRequest cr;
  cr.set_id(id);
  v1::CancelJobResponse cresp;
  s = d.stub().CancelJob(&cc, cr, &cresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message().substr(0, 200);
}

// /metrics was served one connection at a time: ten idle clients delayed a scrape by 20 s. The scrape must be
// answered while they stay connected (the client below gives up after 5 s).
TEST(Reliability, MetricsScrapeIsAnsweredWhileIdleClientsHoldConnections) {
  Daemon d;
  ASSERT_GT(d.metrics_port(), 0) << d.Log();
  auto connect_to = [&](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  };
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(connect_to(d.metrics_port()));
  const int fd = connect_to(d.metrics_port());
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  for (int i : idle) ::close(i);
  EXPECT_TRUE(Contains(resp, "200 OK")) << resp.substr(0, 200);
  EXPECT_TRUE(Contains(resp, "slide_jobs")) << resp.substr(0, 400);
}

// A model whose weights hold NaN trained to SUCCEEDED and exported NaN weights: now it fails, naming the tensor.
TEST(Reliability, NanWeightsFailTheJobAndExportNothing) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  Scratch dir("nan");
  CopyDemoModel(dir / "model");
  // The first bf16 weight of the data section becomes NaN (0x7fc0): find the header length, then write it.
  const std::string weights = (dir / "model/model.safetensors").string();
  std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  f.read(reinterpret_cast<char*>(&header), 8);
  const std::string text = ReadText(weights).substr(8, header);
  ASSERT_TRUE(Contains(text, "\"BF16\"") || Contains(text, "\"F32\"")) << text.substr(0, 200);
  const bool bf16 = Contains(text, "\"BF16\"");
  f.seekp(static_cast<std::streamoff>(8 + header));
  const uint32_t nan32 = 0x7fc00000u;
  const uint16_t nan16 = 0x7fc0u;
  if (bf16) {
    f.write(reinterpret_cast<const char*>(&nan16), 2);
  } else {
    f.write(reinterpret_cast<const char*>(&nan32), 4);
  }
  f.close();
  v1::JobSpec spec = DemoJobSpec((dir / "out").string(), 2);
  spec.set_model_dir((dir / "model").string());
  const std::string id = Submit(d, spec);
  ASSERT_FALSE(id.empty());
  const v1::Job done = WaitFinal(d, id);
  EXPECT_EQ(done.state(), v1::FAILED);
  EXPECT_TRUE(Contains(done.error(), "holds NaN or infinite values")) << done.error();
  EXPECT_FALSE(fs::exists(dir / "out/model.safetensors"));
  EXPECT_EQ(Health(d), Serving::SERVING);
}

// A full disk as a job ends: the job was reported SUCCEEDED while its record never reached the disk, and ran a
// second time after a restart. The state directory sits on a small tmpfs (a private mount namespace) filled up
// while the job runs; the final record must still be written (from the reserve) before SUCCEEDED is shown.
TEST(Reliability, AJobEndingOnAFullDiskIsDurablyFinishedAndNeverRunsAgain) {
  if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    GTEST_SKIP() << "cannot make a private mount namespace here (needs CAP_SYS_ADMIN) to fill a tmpfs";
  Scratch dir("diskfull");
  const std::string state = (dir / "state").string();
  fs::create_directories(state);
  if (::mount("tmpfs", state.c_str(), "tmpfs", 0, "size=24m") != 0) GTEST_SKIP() << "cannot mount a tmpfs";
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{state};
  std::string id;
  {
    Daemon d(DaemonOptions{.state_dir = state});
    ASSERT_GT(d.port(), 0) << d.Log();
    v1::JobSpec spec = DemoJobSpec((dir / "out").string(), 30);
    spec.set_checkpoint_every(1000);
    id = Submit(d, spec);
    ASSERT_FALSE(id.empty());
    ASSERT_EQ(WaitFor(
                  d, id, [](const v1::Job& j) { return j.step() >= 1; }, 120)
                  .state(),
              v1::RUNNING);
    {  // fill the disk
      std::ofstream filler(state + "/filler", std::ios::binary);
      const std::string block(1 << 16, 'x');
      while (filler.write(block.data(), block.size())) {
      }
    }
    const v1::Job done = WaitFinal(d, id);
    EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error();
    // What the daemon reported is what the disk holds.
    EXPECT_TRUE(Contains(ReadText(state + "/jobs/" + id + "/record.json"), "\"state\": \"SUCCEEDED\""))
        << ReadText(state + "/jobs/" + id + "/record.json");
    EXPECT_TRUE(Contains(d.Log(), "released the state directory's reserve")) << d.Log();
    d.Kill();
  }
  fs::remove(state + "/filler");
  Daemon again(DaemonOptions{.state_dir = state});
  ASSERT_GT(again.port(), 0) << again.Log();
  const v1::Job after = Get(again, id);
  EXPECT_EQ(after.state(), v1::SUCCEEDED);
  grpc::ClientContext c;
  v1::GetServerStatusRequest r;
  v1::ServerStatus st;
  ASSERT_TRUE(again.stub().GetServerStatus(&c, r, &st).ok());
  EXPECT_EQ(st.queued_jobs(), 0);
  EXPECT_TRUE(st.running_job().empty());
}

}  // namespace
