// The real slidectl binary against a real slided: submit + follow to success, list/get/cancel, JSON output
// parsed back, exit codes for failures, bad files and an unreachable daemon; `render` on its own (local).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/integration/daemon_calls.h"
#include "tests/integration/daemon_process.h"

namespace {

namespace v1 = slide::v1;
using slide::testing::Daemon;
using slide::testing::Events;
using slide::testing::WaitFor;

struct CliResult {
  int code;
  std::string out;
};

// `raw`: args is the whole shell command line (to set environment variables).
CliResult Slidectl(const std::string& args, bool raw = false) {
  const std::string cmd = (raw ? args : std::string(SLIDECTL_PATH) + " " + args) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string WriteJob(const Daemon& d, const std::string& name, int steps, const std::string& extra = "") {
  const std::string path = d.Path(name + ".yaml");
  std::ofstream(path) << "name: " << name << "\nmodel_dir: " << SLIDE_SOURCE_DIR << "/deploy/demo/model\n"
                      << "dataset: " << SLIDE_SOURCE_DIR << "/deploy/demo/train.jsonl\noutput_dir: out-" << name
                      << "\nsteps: " << steps << "\nbatch_size: 16\nseq_len: 32\nsequence_mode: truncate\nlr: 0.003\n"
                      << "warmup_steps: 2\ndevice: cpu\n"
                      << extra;
  return path;
}

TEST(Slidectl, SubmitFollowListGetCancel) {
  Daemon d;
  const std::string addr = "--addr " + d.addr();
  CliResult r = Slidectl(addr + " submit " + WriteJob(d, "first", 15) + " --follow");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 15/15"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SUCCEEDED: 15 steps, loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exported model: " + d.Path("out-first")), std::string::npos) << r.out;

  r = Slidectl(addr + " --json list --state SUCCEEDED");
  ASSERT_EQ(r.code, 0) << r.out;
  auto list = nlohmann::json::parse(r.out);
  ASSERT_EQ(list["jobs"].size(), 1u);
  const std::string id = list["jobs"][0]["id"];
  EXPECT_EQ(list["jobs"][0]["state"], "SUCCEEDED");

  r = Slidectl(addr + " --json get " + id);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["step"], "15");  // int64 is a string in proto JSON

  // Two more: the second waits in the queue and is cancelled there.
  ASSERT_EQ(Slidectl(addr + " submit " + WriteJob(d, "second", 30)).code, 0);
  r = Slidectl(addr + " --json submit " + WriteJob(d, "third", 30));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string third = nlohmann::json::parse(r.out)["id"];
  r = Slidectl(addr + " cancel " + third);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("CANCELLED"), std::string::npos) << r.out;
  r = Slidectl(addr + " watch " + third);
  EXPECT_EQ(r.code, 1) << r.out;  // a cancelled job
  r = Slidectl(addr + " status");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("slided 0.1.0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" on cpu ("), std::string::npos) << r.out;  // the device (CI has no GPU)
}

// Every hyperparameter a job file can set reaches the engine and comes back through GetJob, defaults included
// (the daemon's GPU budget among them); a bad optimizer setting is refused at submission naming the field.
TEST(Slidectl, TheWholeSpecRoundTripsThroughTheApi) {
  Daemon d;
  const std::string addr = "--addr " + d.addr();
  CliResult r = Slidectl(addr + " --json submit " +
                         WriteJob(d, "adam", 6, "adam_beta1: 0.8\nadam_beta2: 0.99\nadam_eps: 1.0e-6\nlog_every: 3\n"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string id = nlohmann::json::parse(r.out)["id"];
  ASSERT_EQ(WaitFor(
                d, id, [](const v1::Job& j) { return j.state() == v1::SUCCEEDED; }, 120)
                .state(),
            v1::SUCCEEDED);
  r = Slidectl(addr + " --json get " + id);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto spec = nlohmann::json::parse(r.out)["spec"];
  EXPECT_EQ(spec["adam_beta1"], 0.8) << spec.dump();
  EXPECT_EQ(spec["adam_beta2"], 0.99) << spec.dump();
  EXPECT_EQ(spec["adam_eps"], 1e-6) << spec.dump();
  EXPECT_EQ(spec["log_every"], "3") << spec.dump();                     // int64 is a string in proto JSON
  EXPECT_EQ(spec["lr_schedule"], "LR_SCHEDULE_COSINE") << spec.dump();  // the engine's default
  EXPECT_FALSE(spec.contains("gpu_budget_bytes")) << spec.dump();  // as sent: the daemon's default is not copied in
  EXPECT_FALSE(spec.contains("checkpoint_every")) << spec.dump();  // as sent: the daemon's default is not copied in
  EXPECT_EQ(spec["batch_size"], "16") << spec.dump();
  // log_every 3 over 6 steps: metrics at steps 3 and 6 only.
  int metrics = 0;
  for (const v1::JobEvent& e : Events(d, id)) metrics += e.has_metrics() ? 1 : 0;
  EXPECT_EQ(metrics, 2);

  r = Slidectl(addr + " submit " + WriteJob(d, "bad-beta", 2, "adam_beta1: 1.0\n"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("adam_beta1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("must be in [0, 1)"), std::string::npos) << r.out;
}

TEST(Slidectl, ExitCodesAndOneLineErrors) {
  Daemon d;
  const std::string addr = "--addr " + d.addr();
  CliResult r = Slidectl(addr + " submit " + WriteJob(d, "bad", 5, "epochs: many\n"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("field 'epochs' has the wrong type ('many')"), std::string::npos) << r.out;
  r = Slidectl(addr + " submit " + WriteJob(d, "typo", 5, "learning_rate: 0.1\n"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find(":12: unknown field 'learning_rate'"), std::string::npos) << r.out;
  r = Slidectl(addr + " submit " + WriteJob(d, "invalid", 5, "micro_batch_size: 5\n"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: job field 'micro_batch_size' must divide batch_size (16)\n");
  // A key given twice, and an explicit zero where zero means nothing, are errors (not silent defaults).
  r = Slidectl(addr + " submit " + WriteJob(d, "twice", 5, "steps: 7\n"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find(":12: field 'steps' is given twice"), std::string::npos) << r.out;
  std::ofstream(d.Path("zero-batch.yaml")) << "model_dir: " << SLIDE_SOURCE_DIR << "/deploy/demo/model\n"
                                           << "dataset: x.jsonl\noutput_dir: out\nbatch_size: 0\n";
  r = Slidectl(addr + " submit " + d.Path("zero-batch.yaml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: job field 'batch_size' must be in [1, 1048576]\n");
  // A misspelt flag, a stray word or a flag without its value is an error naming it.
  r = Slidectl(addr + " submit " + WriteJob(d, "typo-flag", 5) + " --folow");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: The following argument was not expected: --folow (see --help)\n");
  r = Slidectl(addr + " get job-000001 job-000002");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: The following argument was not expected: job-000002 (see --help)\n");
  r = Slidectl(addr + " watch job-000001 --from-step");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: --from-step: 1 required INT missing (see --help)\n");
  r = Slidectl(addr + " watch job-000001 --from-step three");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: Could not convert: --from-step = three (see --help)\n");
  r = Slidectl("status --addr");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: --addr: 1 required TEXT missing (see --help)\n");
  r = Slidectl(addr + " submit");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: FILE.yaml is required (see --help)\n");
  r = Slidectl(addr);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: no command (see --help)\n");
  r = Slidectl(addr + " submit /nonexistent/job.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cannot open job file"), std::string::npos) << r.out;
  r = Slidectl(addr + " get job-424242");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: no job 'job-424242'\n");
  r = Slidectl(addr + " frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "slidectl: The following argument was not expected: frobnicate (see --help)\n");
  // A model that is not there is refused at submission (the daemon plans memory from its config.json).
  std::ofstream(d.Path("nomodel.yaml")) << "model_dir: /nonexistent/model\ndataset: x.jsonl\noutput_dir: out\n"
                                           "steps: 2\ndevice: cpu\n";
  r = Slidectl(addr + " submit " + d.Path("nomodel.yaml"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/model/config.json"), std::string::npos) << r.out;
  // A failing job: exit 1 with the daemon's error.
  std::ofstream(d.Path("broken.yaml"))
      << "model_dir: " << SLIDE_SOURCE_DIR << "/deploy/demo/model\n"
      << "dataset: missing.jsonl\noutput_dir: out\nsteps: 2\nseq_len: 32\ndevice: cpu\n";
  r = Slidectl(addr + " submit " + d.Path("broken.yaml") + " --follow");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error: NOT_FOUND: " + d.Path("missing.jsonl") + ": cannot open dataset"), std::string::npos)
      << r.out;
  EXPECT_EQ(d.Terminate(15), 0);
  r = Slidectl(addr + " --json status");  // nobody listens now
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_EQ(Slidectl("--help").code, 0);
  CliResult help = Slidectl("submit --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("Usage: slidectl submit [OPTIONS] FILE.yaml"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--follow"), std::string::npos) << help.out;
}

// A daemon with a token: slidectl without it exits 3 with the daemon's message; --token or SLIDE_TOKEN work.
TEST(Slidectl, TokenFromTheFlagOrTheEnvironment) {
  Daemon d(slide::testing::DaemonOptions{.token_env = "tok-123"});
  const std::string addr = "--addr " + d.addr();
  CliResult r = Slidectl(addr + " status");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("this daemon requires a bearer token"), std::string::npos) << r.out;
  r = Slidectl(addr + " --token wrong status");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("wrong bearer token"), std::string::npos) << r.out;
  r = Slidectl(addr + " --token tok-123 status");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("gpu memory:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("host memory:"), std::string::npos) << r.out;
  r = Slidectl("SLIDE_TOKEN=tok-123 " + std::string(SLIDECTL_PATH) + " " + addr + " --json status", true);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["state_dir"], d.state_dir()) << r.out;
}

// security.tls_cert_file/tls_key_file: gRPC over TLS. slidectl with --tls-ca trusting the certificate gets
// through; without it (plaintext) it cannot reach the daemon.
TEST(Slidectl, TlsWithTheDaemonsCertificate) {
  if (std::system("openssl version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl binary to make a certificate";
  Daemon plain;  // only for its temporary directory
  const std::string cert = plain.Path("cert.pem"), key = plain.Path("key.pem"), config = plain.Path("tls.yaml");
  const std::string make =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext "
      "subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
      key + " -out " + cert + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0);
  std::ofstream(config) << "security:\n  tls_cert_file: " << cert << "\n  tls_key_file: " << key << "\n";
  Daemon d(slide::testing::DaemonOptions{.extra_args = {"--config", config}, .tcp = true});
  ASSERT_GT(d.port(), 0) << d.Log();
  EXPECT_NE(d.Log().find(", TLS, bearer token)"), std::string::npos) << d.Log();
  const std::string addr = "--addr " + d.addr() + " --token-file " + d.state_dir() + "/token";
  CliResult r = Slidectl(addr + " --tls-ca " + cert + " status");
  EXPECT_EQ(r.code, 0) << r.out;
  r = Slidectl(addr + " status");
  EXPECT_EQ(r.code, 3) << r.out;
}

// On a terminal, --follow redraws one progress line instead of printing a line per step (read off a real tmux
// pane), then prints the summary.
TEST(Slidectl, LiveProgressOnATerminal) {
  if (std::system("command -v tmux >/dev/null 2>&1") != 0) GTEST_SKIP() << "tmux is not installed";
  Daemon d;
  const std::string session = "slidectl-test-" + std::to_string(getpid());
  const std::string done = d.Path("done");
  const std::string cmd = std::string(SLIDECTL_PATH) + " --addr " + d.addr() + " submit " + WriteJob(d, "tty", 25) +
                          " --follow; echo exit=$? > " + done + "; sleep 60";
  ASSERT_EQ(std::system(("tmux new-session -d -x 160 -y 40 -s " + session + " '" + cmd + "'").c_str()), 0);
  // Up to 3 minutes: ctest runs two suites at once, and beside the 50-watcher load test a 25-step job is slow.
  for (int i = 0; i < 1800 && !std::filesystem::exists(done); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string pane_file = d.Path("pane");
  std::system(("tmux capture-pane -p -t " + session + " > " + pane_file + "; tmux kill-session -t " + session).c_str());
  std::ifstream in(pane_file);
  std::string pane((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ifstream exit_in(done);
  std::string exit_line;
  std::getline(exit_in, exit_line);
  EXPECT_EQ(exit_line, "exit=0") << pane;
  EXPECT_NE(pane.find("step 25/25"), std::string::npos) << pane;
  EXPECT_EQ(pane.find("step 24/25"), std::string::npos) << "progress should be redrawn in place:\n" << pane;
  EXPECT_NE(pane.find("SUCCEEDED: 25 steps, loss"), std::string::npos) << pane;
  EXPECT_NE(pane.find("host "), std::string::npos) << pane;  // memory is part of the progress line
}

// Ctrl-C while following detaches the client; the job runs on to success.
TEST(Slidectl, CtrlCDetachesWithoutCancelling) {
  if (std::system("command -v tmux >/dev/null 2>&1") != 0) GTEST_SKIP() << "tmux is not installed";
  Daemon d;
  const std::string addr = "--addr " + d.addr();
  const std::string session = "slidectl-ctrlc-" + std::to_string(getpid());
  const std::string cmd =
      std::string(SLIDECTL_PATH) + " " + addr + " submit " + WriteJob(d, "detach", 60) + " --follow; sleep 60";
  ASSERT_EQ(std::system(("tmux new-session -d -x 160 -y 40 -s " + session + " '" + cmd + "'").c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // submitted and following
  std::system(("tmux send-keys -t " + session + " C-c").c_str());
  std::string id;
  for (int i = 0; i < 1800; ++i) {  // the job still finishes (up to 3 minutes on a loaded machine)
    CliResult r = Slidectl(addr + " --json list");
    auto jobs = nlohmann::json::parse(r.out)["jobs"];
    if (!jobs.empty() && jobs[0]["state"] == "SUCCEEDED") {
      id = jobs[0]["id"];
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::system(("tmux kill-session -t " + session).c_str());
  EXPECT_FALSE(id.empty()) << "the job did not run to success after the client detached";
}

// --cancel-on-interrupt: Ctrl-C cancels the job first (exit 1, the job CANCELLED); --from-step skips earlier
// steps' progress.
TEST(Slidectl, InterruptCancelsWhenAskedAndWatchFromAStep) {
  Daemon d;
  const std::string addr = d.addr();
  const std::string out = d.Path("follow.out");
  const pid_t pid = fork();
  if (pid == 0) {
    if (std::freopen(out.c_str(), "w", stdout) == nullptr) _exit(126);
    execl(SLIDECTL_PATH, SLIDECTL_PATH, "--addr", addr.c_str(), "submit", WriteJob(d, "interrupt", 500).c_str(),
          "--follow", "--cancel-on-interrupt", nullptr);
    _exit(127);
  }
  std::string id;
  for (int i = 0; i < 600 && id.empty(); ++i) {  // until the job has made a few steps
    CliResult r = Slidectl("--addr " + addr + " --json list");
    auto jobs = nlohmann::json::parse(r.out)["jobs"];
    if (!jobs.empty() && jobs[0].contains("step") && std::stoll(jobs[0]["step"].get<std::string>()) >= 3)
      id = jobs[0]["id"];
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(id.empty());
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);  // the job was cancelled
  CliResult r = Slidectl("--addr " + addr + " --json get " + id);
  EXPECT_EQ(nlohmann::json::parse(r.out)["state"], "CANCELLED") << r.out;
  const int64_t last = std::stoll(nlohmann::json::parse(r.out)["step"].get<std::string>());

  r = Slidectl("--addr " + addr + " watch " + id + " --from-step " + std::to_string(last));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("step " + std::to_string(last) + "/500"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1/500"), std::string::npos) << r.out;
  EXPECT_EQ(Slidectl("--addr " + addr + " watch " + id + " --from-step x").code, 2);
}

}  // namespace

namespace {

// A dataset path and a dataset error carrying terminal escape sequences (a title change, a screen clear) reach
// slidectl's list, get, logs and watch escaped, never raw.
TEST(Slidectl, TerminalEscapesFromTheDaemonArePrintedEscaped) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  const std::string evil_dir = d.Path("data\x1b]0;pwned\x07");
  std::filesystem::create_directories(evil_dir);
  std::ofstream(evil_dir + "/train.jsonl") << "{\"text\": \"fine\"}\n{oops \x1b[2J\x1b[H\n";
  v1::JobSpec spec = slide::testing::DemoJobSpec(d.Path("out"), 2);
  spec.set_dataset(evil_dir + "/train.jsonl");
  const std::string id = slide::testing::Submit(d, spec);
  ASSERT_FALSE(id.empty());
  const v1::Job done = WaitFor(
      d, id, [](const v1::Job& j) { return j.state() == v1::FAILED; }, 120);
  ASSERT_EQ(done.state(), v1::FAILED);
  ASSERT_NE(done.error().find('\x1b'), std::string::npos);  // the daemon's own record keeps the bytes
  const std::string addr = "--addr " + d.addr();
  for (const std::string& command : std::vector<std::string>{"list", "get " + id, "logs " + id, "watch " + id}) {
    const CliResult r = Slidectl(addr + " " + command);
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << command << ": " << r.out;
    EXPECT_EQ(r.out.find('\x07'), std::string::npos) << command << ": " << r.out;
    EXPECT_NE(r.out.find("\\x1b]0;pwned\\x07"), std::string::npos) << command << ": " << r.out;
  }
}

// Every path slidectl reads is checked: a directory or FIFO as the job file is one line and exit 2, not an
// uncaught exception or a hang; an unclosed quote names its line.
TEST(Slidectl, BadJobFilePathsAreOneLineAndExitTwo) {
  Daemon d;
  ASSERT_GT(d.port(), 0) << d.Log();
  const std::string addr = "--addr " + d.addr();
  CliResult r = Slidectl(addr + " submit " + d.Path(""));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is a directory, not a job file"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  const std::string fifo = d.Path("job.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = Slidectl(addr + " submit " + fifo);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is a FIFO, not a job file"), std::string::npos) << r.out;
  std::ofstream(d.Path("quote.yaml")) << "steps: 2\nname: \"never closed\nlr: 0.1\n";
  r = Slidectl(addr + " submit " + d.Path("quote.yaml"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("quote.yaml:2: field 'name': a quoted value is never closed"), std::string::npos) << r.out;
  r = Slidectl(addr + " --tls-ca " + d.Path("") + " status");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is a directory, not a CA certificate"), std::string::npos) << r.out;
}

// `slidectl render` reads the job's model directory and dataset locally: the model's own template (Qwen2.5's, from
// tokenizer_config.json), each line's tokens with the trained ones between the markers, a bad line's error.
TEST(Slidectl, RenderShowsTheTemplateAndTheTrainedTokens) {
  char tmpl[] = "/tmp/slidectl-render-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path dir = tmpl;
  std::filesystem::create_directories(dir / "model");
  const std::string fixtures = std::string(SLIDE_SOURCE_DIR) + "/tests/fixtures";
  std::filesystem::copy_file(fixtures + "/tokenizers/qwen2/tokenizer.json", dir / "model/tokenizer.json");
  std::ifstream t(fixtures + "/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  const std::string source((std::istreambuf_iterator<char>(t)), std::istreambuf_iterator<char>());
  std::ofstream(dir / "model/tokenizer_config.json")
      << nlohmann::json{{"eos_token", "<|im_end|>"}, {"chat_template", source}}.dump();
  std::ofstream(dir / "data.jsonl")
      << R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})"
      << "\n\n"
      << R"({"messages": [{"role": "user", "content": "no reply"}]})"
      << "\n";
  std::ofstream(dir / "job.yaml") << "model_dir: model\ndataset: data.jsonl\noutput_dir: out\n";
  const std::string job = (dir / "job.yaml").string();

  CliResult r = Slidectl("render " + job);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("data.jsonl:1: messages, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                       "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                       "\u27e6Hello!<|im_end|>\n\u27e7"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("data.jsonl:3: 'messages' has no assistant turn to train on"), std::string::npos) << r.out;

  std::ofstream(dir / "job.yaml", std::ios::app) << "train_on: all\n";
  r = Slidectl("render " + job + " --lines 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\u27e6<|im_start|>system\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("data.jsonl:3"), std::string::npos) << r.out;

  std::filesystem::remove(dir / "model/tokenizer_config.json");  // no template, format messages: refused
  std::ofstream(dir / "job.yaml", std::ios::app) << "dataset_format: messages\n";
  r = Slidectl("render " + job);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("job field 'chat_template' is auto, but"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

// A LoRA job from a job file through the real daemon: trained, its adapter exported in PEFT's files, its mode and
// trained-parameter count shown by `get`; the same as QLoRA; a target the model lacks refused at submission naming
// the field.
TEST(Slidectl, LoraJobFromAJobFile) {
  Daemon d;
  const std::string addr = "--addr " + d.addr();
  CliResult r = Slidectl(addr + " --json submit " +
                         WriteJob(d, "lora", 8, "adapter: lora\nlora_r: 4\nlora_target_modules: q_proj,v_proj\n"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string id = nlohmann::json::parse(r.out)["id"];
  r = Slidectl(addr + " watch " + id);
  EXPECT_EQ(r.code, 0) << r.out;
  r = Slidectl(addr + " logs " + id);
  EXPECT_NE(r.out.find("mode: LoRA r 4, alpha 32"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(d.Path("out-lora/adapter_config.json")));
  EXPECT_TRUE(std::filesystem::exists(d.Path("out-lora/adapter_model.safetensors")));
  r = Slidectl(addr + " get " + id);
  EXPECT_NE(r.out.find("mode: lora r 4 on q_proj,v_proj"), std::string::npos) << r.out;
  // r 4 on q (128 x 128) and v (64 x 128) of 4 layers: (4 x 128 + 128 x 4 + 4 x 128 + 64 x 4) x 4 = 7,168.
  EXPECT_NE(r.out.find("(7168 of "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" parameters trained"), std::string::npos) << r.out;
  r = Slidectl(addr + " --json get " + id);
  const auto got = nlohmann::json::parse(r.out);
  EXPECT_EQ(got["spec"]["adapter"], "ADAPTER_LORA") << r.out;
  EXPECT_EQ(got.value("trainable_params", std::string()), "7168") << r.out;
  // The same as QLoRA: the demo model's layers in NF4.
  r = Slidectl(addr + " --json submit " +
               WriteJob(d, "qlora", 4, "adapter: qlora\nlora_r: 4\nlora_target_modules: q_proj,v_proj\n"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string qid = nlohmann::json::parse(r.out)["id"];
  EXPECT_EQ(Slidectl(addr + " watch " + qid).code, 0);
  r = Slidectl(addr + " logs " + qid);
  EXPECT_NE(r.out.find("mode: QLoRA (NF4 base, double quantised) r 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("frozen base (NF4 layers)"), std::string::npos) << r.out;
  r = Slidectl(addr + " get " + qid);
  EXPECT_NE(r.out.find("mode: qlora r 4 on q_proj,v_proj (7168 of "), std::string::npos) << r.out;

  r = Slidectl(addr + " submit " + WriteJob(d, "lora-bad", 4, "adapter: lora\nlora_target_modules: q_proj,c_attn\n"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("lora_target_modules: this model has no module \"c_attn\""), std::string::npos) << r.out;
  r = Slidectl(addr + " submit " + WriteJob(d, "lora-stray", 4, "lora_r: 8\n"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("need adapter: lora"), std::string::npos) << r.out;
}

}  // namespace
