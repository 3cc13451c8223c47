// Bad input an outside tester tried against the real slided: files linked out of the allowed roots, FIFOs and
// directories where files belong, an output path that is a file, meaningless zeros, sequences beyond the
// model, odd job names, bad listen addresses, an empty token file, the bearer scheme's case and the health
// service by name. Each is refused with the field or file named, and the daemon carries on.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

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
using slide::testing::Submit;
using slide::testing::WaitFor;
using Serving = grpc::health::v1::HealthCheckResponse;

using slide::testing::Contains;
using slide::testing::CopyDemoModel;
using slide::testing::kDemo;
using slide::testing::Scratch;
using slide::testing::WaitFinal;

TEST(BadInput, FilesLinkedOutOfTheRootsAreNeverOpened) {
  Scratch root("links"), outside("outside");
  const std::string secret = (outside / "secret.txt").string();
  std::ofstream(secret) << "TOPSECRET: not JSON and not a model\n";
  std::ofstream(root / "train.jsonl") << std::ifstream(kDemo + "/train.jsonl").rdbuf();
  CopyDemoModel(root / "weights-linked", "model.safetensors", kDemo + "/model/model.safetensors");
  CopyDemoModel(root / "tokenizer-linked", "tokenizer.json", secret);
  CopyDemoModel(root / "config-linked", "config.json", secret);
  const std::string config = (root / "slided.yaml").string();
  std::ofstream(config) << "security:\n  allowed_roots: [" << root.str() << "]\n";
  Daemon d(DaemonOptions{.extra_args = {"--config", config}});
  ASSERT_GT(d.port(), 0) << d.Log();

  auto spec_for = [&](const std::string& model) {
    v1::JobSpec s = DemoJobSpec((root / ("out-" + model)).string(), 3);
    s.set_model_dir((root / model).string());
    s.set_dataset((root / "train.jsonl").string());
    return s;
  };
  // config.json is read at submission (the memory plan), the weights' headers are checked against it there and
  // the tokenizer files are checked too: refused there, their bytes unread.
  for (const std::string model : {"config-linked", "tokenizer-linked", "weights-linked"}) {
    grpc::Status s;
    Submit(d, spec_for(model), &s);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << model << ": " << s.error_message();
    EXPECT_TRUE(Contains(s.error_message(), "outside the allowed roots")) << s.error_message();
    EXPECT_FALSE(Contains(s.error_message(), "TOPSECRET")) << s.error_message();
  }

  grpc::Status s;
  Submit(d, spec_for("weights-linked"), &s);
  EXPECT_TRUE(Contains(s.error_message(), "model.safetensors: resolves to")) << s.error_message();
  // A clean copy inside the roots still trains.
  CopyDemoModel(root / "clean");
  const std::string ok = Submit(d, spec_for("clean"), &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(WaitFinal(d, ok).state(), v1::SUCCEEDED);
  EXPECT_EQ(Health(d), Serving::SERVING);
}

TEST(BadInput, FifosDirectoriesAndFileOutputsAreRefusedAtSubmission) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  const std::string fifo = d.Path("fifo.jsonl");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  grpc::Status s;
  v1::JobSpec spec = DemoJobSpec(d.Path("export"), 2);
  spec.set_dataset(fifo);
  Submit(d, spec, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(s.error_message(), "job field 'dataset': " + fifo + ": is a FIFO")) << s.error_message();

  spec = DemoJobSpec(d.Path("export"), 2);
  spec.set_dataset(d.Path(""));
  Submit(d, spec, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(s.error_message(), "is a directory")) << s.error_message();

  std::ofstream(d.Path("out-file")) << "not a directory\n";
  spec = DemoJobSpec(d.Path("out-file"), 2);
  Submit(d, spec, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(s.error_message(), "job field 'output_dir'")) << s.error_message();
  EXPECT_TRUE(Contains(s.error_message(), "exists and is not a directory")) << s.error_message();
  EXPECT_EQ(Health(d), Serving::SERVING);
}

// A dataset replaced by a FIFO after submission: the job's open() must not block the engine thread; the job
// fails naming the file and the next job runs.
TEST(BadInput, AFifoSwappedInAfterSubmissionFailsOnlyItsJob) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  v1::JobSpec first = DemoJobSpec(d.Path("export-1"), 400);  // long enough to swap the file under the second
  const std::string running = Submit(d, first);
  ASSERT_FALSE(running.empty());
  const std::string data = d.Path("later.jsonl");
  std::ofstream(data) << std::ifstream(kDemo + "/train.jsonl").rdbuf();
  v1::JobSpec second = DemoJobSpec(d.Path("export-2"), 2);
  second.set_dataset(data);
  grpc::Status s;
  const std::string swapped = Submit(d, second, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string third = Submit(d, DemoJobSpec(d.Path("export-3"), 2));
  fs::remove(data);
  ASSERT_EQ(mkfifo(data.c_str(), 0600), 0);

  grpc::ClientContext c;
  v1::CancelJobRequest cancel;
  cancel.set_id(running);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(d.stub().CancelJob(&c, cancel, &cancelled).ok());
  const v1::Job failed = WaitFinal(d, swapped);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_TRUE(Contains(failed.error(), data + ": is a FIFO, not a regular file")) << failed.error();
  EXPECT_EQ(WaitFinal(d, third).state(), v1::SUCCEEDED);
}

TEST(BadInput, ExplicitZerosLongSequencesAndOddNamesAreRefused) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  auto refused = [&](const std::function<void(v1::JobSpec&)>& change, const std::string& message) {
    v1::JobSpec spec = DemoJobSpec(d.Path("export"), 2);
    change(spec);
    grpc::Status s;
    Submit(d, spec, &s);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_TRUE(Contains(s.error_message(), message)) << s.error_message();
  };
  refused([](v1::JobSpec& s) { s.set_batch_size(0); }, "job field 'batch_size' must be in [1, 1048576]");
  refused([](v1::JobSpec& s) { s.set_seq_len(0); }, "job field 'seq_len' must be in [2, 1048576]");
  refused([](v1::JobSpec& s) { s.set_lr(0); }, "job field 'lr' must be in (0, 1)");
  refused([](v1::JobSpec& s) { s.set_gpu_budget_bytes(-1); },
          "job field 'gpu_budget_bytes' must be in [0, 1125899906842624] (0 = the daemon's default)");
  refused([](v1::JobSpec& s) { s.set_steps(0), s.set_epochs(0); }, "job field 'epochs' must be in [1, 1048576]");
  // The demo model was trained for 256 positions.
  refused([](v1::JobSpec& s) { s.set_seq_len(512); },
          "job field 'seq_len' (512) exceeds the model's max_position_embeddings (256)");
  refused([](v1::JobSpec& s) { s.set_name(std::string(129, 'n')); }, "job field 'name' is 129 bytes");
  refused([](v1::JobSpec& s) { s.set_name("evil\x1b[2Jname"); }, "job field 'name' contains control characters");
  refused([](v1::JobSpec& s) { s.set_name("c1\u009b2Jname"); }, "job field 'name' contains control characters");
  refused([](v1::JobSpec& s) { s.set_name("bidi\u202Eeman"); }, "job field 'name' contains control characters");

  // Asked for explicitly, a longer sequence is accepted.
  v1::JobSpec longer = DemoJobSpec(d.Path("export"), 1);
  longer.set_seq_len(512);
  longer.set_allow_seq_len_beyond_model(true);
  longer.set_name(std::string(128, 'n'));
  grpc::Status s;
  const std::string id = Submit(d, longer, &s);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(WaitFinal(d, id).state(), v1::SUCCEEDED);
}

TEST(BadInput, BadListenAddressesAndAnEmptyTokenFileStopTheStart) {
  Scratch dir("listen");
  auto start_fails = [&](std::vector<std::string> args, const std::string& message) {
    Daemon d(DaemonOptions{.extra_args = std::move(args), .wait_for_port = false});
    EXPECT_EQ(d.WaitExit(20), 2) << message;
    EXPECT_TRUE(Contains(d.Log(), message)) << d.Log();
    EXPECT_FALSE(Contains(d.Log(), "bearer token")) << d.Log();
  };
  start_fails({"--listen", "127.0.0.1:99999"}, "port '99999' is not a number in 0..65535");
  start_fails({"--listen", "localhost"}, "needs HOST:PORT");
  start_fails({"--listen", "no-such-host.invalid:50151"}, "cannot resolve host 'no-such-host.invalid'");
  start_fails({"--metrics-listen", "127.0.0.1:70000"}, "server.metrics_listen");

  const std::string empty = (dir / "token").string();
  std::ofstream(empty) << "\n";
  const std::string config = (dir / "slided.yaml").string();
  std::ofstream(config) << "security:\n  token_file: " << empty << "\n";
  start_fails({"--config", config}, "config field 'security.token_file': '" + empty + "' holds no token");

  const std::string twice = (dir / "twice.yaml").string();
  std::ofstream(twice) << "jobs:\n  checkpoint_every: 5\n  checkpoint_every: 7\n";
  start_fails({"--config", twice}, twice + ":3:3: jobs.checkpoint_every: duplicate key");
}

TEST(BadInput, BearerSchemeIsCaseInsensitiveAndHealthKnowsTheService) {
  Daemon d(DaemonOptions{.token_env = "s3cret"});
  ASSERT_GT(d.port(), 0) << d.Log();
  auto status_with = [&](const std::string& header) {
    grpc::ClientContext c;
    c.AddMetadata("authorization", header);
    v1::GetServerStatusRequest r;
    v1::ServerStatus s;
    return d.stub().GetServerStatus(&c, r, &s).error_code();
  };
  EXPECT_EQ(status_with("bearer s3cret"), grpc::StatusCode::OK);
  EXPECT_EQ(status_with("BEARER s3cret"), grpc::StatusCode::OK);
  EXPECT_EQ(status_with("Bearer s3cret"), grpc::StatusCode::OK);
  EXPECT_EQ(status_with("Basic s3cret"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status_with("bearer S3cret"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status_with("s3cret"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Health(d), Serving::SERVING);
  EXPECT_EQ(Health(d, "slide.v1.Slide"), Serving::SERVING);
}

// A config.json holding a number beyond a double's range (found by the fuzzer: the JSON library throws
// out_of_range, which escaped the parse-error handler) is refused at submission; the daemon lives on.
TEST(BadInput, ConfigNumberOverflowIsRefusedAndTheDaemonLivesOn) {
  Scratch root("overflow");
  CopyDemoModel(root / "model");
  fs::remove(root / "model" / "config.json");
  std::ofstream(root / "model" / "config.json") << R"({"model_type": "llama", "vocab_size": 1e999})";
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  v1::JobSpec spec = DemoJobSpec((root / "out").string(), 3);
  spec.set_model_dir((root / "model").string());
  grpc::Status s;
  Submit(d, spec, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(Contains(s.error_message(), "config.json: not valid JSON")) << s.error_message();
  EXPECT_EQ(Health(d), Serving::SERVING);
}

// The NVMe tier belongs to the daemon: a job asking for it where none is configured, or with a mode that does
// not exist, is refused at submission naming the field; a tier directory that has gone away fails only the job
// that needed it, and the daemon runs the next one. A job with its optimizer state on the tier trains and exports,
// and its files are gone afterwards.
TEST(BadInput, NvmeStateNeedsTheDaemonsTierAndABrokenTierFailsOnlyItsJob) {
  Scratch root("nvme");
  {
    Daemon plain;
    ASSERT_GT(plain.port(), 0) << plain.Log();
    v1::JobSpec spec = DemoJobSpec((root / "out-plain").string(), 3);
    spec.set_nvme_state(v1::NVME_STATE_MOMENTS);
    grpc::Status s;
    Submit(plain, spec, &s);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_TRUE(Contains(s.error_message(), "nvme.dirs")) << s.error_message();
    spec.set_nvme_state(static_cast<v1::NvmeState>(7));  // proto3 enums are open: a client can send any number
    Submit(plain, spec, &s);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(s.error_message(),
              "job field 'nvme_state' has no value 7 (it takes none, moments or moments_and_master)");
    spec.set_nvme_state(v1::NVME_STATE_NONE);
    spec.set_nvme_layers(2);  // a layer count for a tier the job did not ask for
    Submit(plain, spec, &s);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(s.error_message(), "job field 'nvme_layers' needs nvme_state (moments or moments_and_master)");
  }
  const fs::path nvme = root / "nvme";
  fs::create_directories(nvme);
  std::ofstream(nvme / "slide-unit-00003-a1b2c3.bin") << "left by a daemon killed mid-job";
  std::ofstream(nvme / "notes.bin") << "not the tier's";
  const std::string config = (root / "slided.yaml").string();
  std::ofstream(config) << "nvme:\n  dirs: [" << nvme.string() << "]\n  chunk_bytes: 65536\n  buffers: 3\n";
  Daemon d(DaemonOptions{.extra_args = {"--config", config}});
  ASSERT_GT(d.port(), 0) << d.Log();
  EXPECT_FALSE(fs::exists(nvme / "slide-unit-00003-a1b2c3.bin"));  // removed at start, and said so
  EXPECT_TRUE(Contains(d.Log(), "removed 1 NVMe tier file(s) an earlier run left in " + nvme.string())) << d.Log();
  EXPECT_TRUE(fs::exists(nvme / "notes.bin"));  // only the tier's own names
  fs::remove(nvme / "notes.bin");               // the rest of the test expects the tier to leave the directory empty
  v1::JobSpec on_disk = DemoJobSpec((root / "out-tier").string(), 3);
  on_disk.set_nvme_state(v1::NVME_STATE_MOMENTS_AND_MASTER);
  grpc::Status s;
  const std::string ok_id = Submit(d, on_disk, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const v1::Job done = WaitFinal(d, ok_id);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error();
  EXPECT_TRUE(fs::exists(root / "out-tier" / "model.safetensors"));
  EXPECT_TRUE(fs::is_empty(nvme));
  // Every step reports the tier's backend and traffic: 12 bytes per parameter read and written per update.
  int steps_seen = 0;
  for (const v1::JobEvent& e : Events(d, ok_id)) {
    if (!e.has_metrics()) continue;
    ++steps_seen;
    EXPECT_FALSE(e.metrics().nvme_backend().empty());
    if (e.metrics().step() > 1) {
      EXPECT_GT(e.metrics().nvme_read_bytes(), 0) << "step " << e.metrics().step();
      EXPECT_GT(e.metrics().nvme_written_bytes(), 0) << "step " << e.metrics().step();
    }
  }
  EXPECT_EQ(steps_seen, 3);
  const std::string metrics = slide::testing::HttpGet(d.metrics_port(), "/metrics");
  EXPECT_TRUE(Contains(metrics, "slide_nvme_bytes_total{direction=\"read\"}")) << metrics;
  EXPECT_TRUE(Contains(metrics, "slide_nvme_backend{backend=")) << metrics;

  // Only the last layer's state on the tier: it trains, GetJob shows the count, and a count beyond the model's
  // layers is refused at submission naming the model's count.
  on_disk.set_output_dir((root / "out-last").string());
  on_disk.set_nvme_layers(1);
  const std::string last_id = Submit(d, on_disk, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const v1::Job last = WaitFinal(d, last_id);
  EXPECT_EQ(last.state(), v1::SUCCEEDED) << last.error();
  EXPECT_EQ(last.spec().nvme_layers(), 1);
  EXPECT_TRUE(fs::is_empty(nvme));
  on_disk.set_output_dir((root / "out-deep").string());
  on_disk.set_nvme_layers(1000);
  Submit(d, on_disk, &s);  // the planner at submission knows the demo model's 4 layers
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "job field 'nvme_layers' (1000) exceeds the model's 4 layers");
  on_disk.clear_nvme_layers();

  fs::remove_all(nvme);  // the disk went away between jobs
  on_disk.set_output_dir((root / "out-gone").string());
  on_disk.set_nvme_state(v1::NVME_STATE_MOMENTS);
  const std::string failed_id = Submit(d, on_disk, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const v1::Job failed = WaitFinal(d, failed_id);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.step(), 0);
  EXPECT_TRUE(Contains(failed.error(), nvme.string() + "/slide-unit-00000-")) << failed.error();
  EXPECT_TRUE(Contains(failed.error(), "cannot create")) << failed.error();

  const std::string next_id = Submit(d, DemoJobSpec((root / "out-next").string(), 3), &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(WaitFinal(d, next_id).state(), v1::SUCCEEDED);
}

}  // namespace
