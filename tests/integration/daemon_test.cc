// The real slided binary on loopback (port 0) driven through gRPC: submit the bundled demo job and watch it to
// SUCCEEDED with falling loss; bad specs and unknown ids get precise codes; cancelling a queued job; SIGTERM
// exits cleanly.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "slide/v1/slide.grpc.pb.h"
#include "tests/integration/daemon_process.h"

namespace {

namespace v1 = slide::v1;
namespace fs = std::filesystem;
using slide::testing::Daemon;

v1::JobSpec DemoSpec(const Daemon& d, int steps) { return slide::testing::DemoJobSpec(d.Path("export"), steps); }

TEST(Daemon, DemoJobRunsToSuccessWithFallingLoss) {
  Daemon d;
  ASSERT_GT(d.port(), 0);
  grpc::ClientContext c1;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = DemoSpec(d, 20);
  v1::SubmitJobResponse resp;
  ASSERT_TRUE(d.stub().SubmitJob(&c1, req, &resp).ok());
  const std::string id = resp.job().id();
  EXPECT_EQ(resp.job().state(), v1::QUEUED);

  grpc::ClientContext c2;
  c2.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  v1::WatchJobRequest w;
  w.set_id(id);
  auto reader = d.stub().WatchJob(&c2, w);
  v1::JobEvent e;
  std::vector<double> losses;
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  int64_t prev_seq = 0;
  while (reader->Read(&e)) {
    EXPECT_GT(e.seq(), prev_seq);
    prev_seq = e.seq();
    if (e.has_metrics()) losses.push_back(e.metrics().loss());
    if (e.kind_case() == v1::JobEvent::kState) last = e.state();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last, v1::SUCCEEDED);
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_LT(losses.back(), 0.7 * losses.front());

  grpc::ClientContext c3;
  v1::GetJobRequest g;
  g.set_id(id);
  v1::GetJobResponse job;
  ASSERT_TRUE(d.stub().GetJob(&c3, g, &job).ok());
  EXPECT_EQ(job.job().state(), v1::SUCCEEDED);
  EXPECT_EQ(job.job().step(), 20);
  EXPECT_TRUE(fs::exists(job.job().export_dir() + "/model.safetensors"));

  // Resuming a watch after the end replays only what follows the given sequence number.
  grpc::ClientContext c4;
  w.set_after_seq(prev_seq - 1);
  auto tail = d.stub().WatchJob(&c4, w);
  int n = 0;
  while (tail->Read(&e)) ++n;
  EXPECT_EQ(n, 1);
  EXPECT_EQ(d.Terminate(15), 0);
}

TEST(Daemon, BadRequestsGetPreciseCodes) {
  Daemon d;
  grpc::ClientContext c1;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = DemoSpec(d, 5);
  req.mutable_spec()->set_micro_batch_size(5);
  v1::SubmitJobResponse resp;
  grpc::Status s = d.stub().SubmitJob(&c1, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("job field 'micro_batch_size' must divide batch_size (16)"), std::string::npos)
      << s.error_message();

  grpc::ClientContext c2;
  v1::GetJobRequest g;
  g.set_id("job-999999");
  v1::GetJobResponse job;
  EXPECT_EQ(d.stub().GetJob(&c2, g, &job).error_code(), grpc::StatusCode::NOT_FOUND);

  // A job with a broken dataset fails alone; the daemon keeps serving.
  grpc::ClientContext c3;
  *req.mutable_spec() = DemoSpec(d, 5);
  req.mutable_spec()->set_dataset("/nonexistent/data.jsonl");
  ASSERT_TRUE(d.stub().SubmitJob(&c3, req, &resp).ok());
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext c;
    g.set_id(resp.job().id());
    ASSERT_TRUE(d.stub().GetJob(&c, g, &job).ok());
    if (job.job().state() == v1::FAILED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(job.job().state(), v1::FAILED);
  EXPECT_NE(job.job().error().find("/nonexistent/data.jsonl: cannot open dataset"), std::string::npos)
      << job.job().error();
  grpc::ClientContext c4;
  v1::GetServerStatusRequest sr;
  v1::ServerStatus st;
  EXPECT_TRUE(d.stub().GetServerStatus(&c4, sr, &st).ok());
  EXPECT_FALSE(st.draining());
}

TEST(Daemon, QueuedJobsRunInOrderAndCancelIsImmediate) {
  Daemon d;
  std::vector<std::string> ids;
  for (int k = 0; k < 3; ++k) {
    grpc::ClientContext c;
    v1::SubmitJobRequest req;
    *req.mutable_spec() = DemoSpec(d, 5);
    req.mutable_spec()->set_output_dir(d.Path("export" + std::to_string(k)));
    v1::SubmitJobResponse resp;
    ASSERT_TRUE(d.stub().SubmitJob(&c, req, &resp).ok());
    ids.push_back(resp.job().id());
  }
  grpc::ClientContext cc;
  v1::CancelJobRequest cancel;
  cancel.set_id(ids[2]);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(d.stub().CancelJob(&cc, cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.job().state(), v1::CANCELLED);

  // Wait for the second job; the first must have finished before it.
  v1::GetJobResponse a, b;
  for (int i = 0; i < 1200; ++i) {
    grpc::ClientContext c1, c2;
    v1::GetJobRequest g;
    g.set_id(ids[1]);
    ASSERT_TRUE(d.stub().GetJob(&c1, g, &b).ok());
    if (b.job().state() == v1::SUCCEEDED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  grpc::ClientContext c3;
  v1::GetJobRequest g;
  g.set_id(ids[0]);
  ASSERT_TRUE(d.stub().GetJob(&c3, g, &a).ok());
  EXPECT_EQ(a.job().state(), v1::SUCCEEDED);
  EXPECT_EQ(b.job().state(), v1::SUCCEEDED);
  EXPECT_LE(a.job().finished_unix_ms(), b.job().finished_unix_ms());

  grpc::ClientContext c4;
  v1::ListJobsRequest lr;
  lr.set_state(v1::SUCCEEDED);
  v1::ListJobsResponse list;
  ASSERT_TRUE(d.stub().ListJobs(&c4, lr, &list).ok());
  EXPECT_EQ(list.jobs_size(), 2);
}

}  // namespace
