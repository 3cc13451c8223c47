// slidectl: the command-line client of slided.
// Exit codes: 0 done / job succeeded, 1 job failed or cancelled, 2 usage or bad input, 3 daemon unreachable or
// authentication refused. Errors are one line: the daemon's message.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "client/job_file.h"
#include "client/local_file.h"
#include "client/render_command.h"
#include "client/terminal_text.h"
#include "engine/common/default_state_dir.h"
#include "slide/v1/slide.grpc.pb.h"

namespace v1 = slide::v1;

namespace {

constexpr int kOk = 0, kJobFailed = 1, kUsage = 2, kUnreachable = 3;

// Below the generated help: what the flags' descriptions leave out.
const char* kHelpFooter =
    R"(exit codes: 0 done / job succeeded, 1 job failed or cancelled, 2 usage or bad input, 3 daemon unreachable
or authentication refused. Each command has its own --help (slidectl submit --help).
environment: SLIDE_ADDR (default: the daemon's socket, unix:$XDG_DATA_HOME/slideformer/slided.sock or
unix:~/.local/share/slideformer/slided.sock), SLIDE_TOKEN, SLIDE_TOKEN_FILE, SLIDE_TLS_CA. Over TCP without a
token, the token a local slided generated (<state dir>/token) is used when this user can read it.)";

std::string Env(const char* name) { return std::getenv(name) != nullptr ? std::getenv(name) : ""; }

struct Options {
  std::string addr = Env("SLIDE_ADDR");  // empty: the default state directory's socket
  std::string token = Env("SLIDE_TOKEN");
  std::string token_file = Env("SLIDE_TOKEN_FILE");
  std::string tls_ca = Env("SLIDE_TLS_CA");
  bool json = false;
};

constexpr size_t kMaxSmallFileBytes = 1 << 20;  // a CA bundle or a token file

// The address and token once flags and environment are read: the default state directory supplies the socket,
// and over TCP its generated token (a daemon started by this user with --listen HOST:PORT and no token).
std::string ResolveConnection(Options* o) {
  std::string error;
  if (!o->token_file.empty() && o->token.empty()) {
    const std::string text = slidectl::ReadLocalFile(o->token_file, "token file", kMaxSmallFileBytes, &error);
    if (!error.empty()) return error;
    o->token = text.substr(0, text.find('\n'));
    if (o->token.empty()) return o->token_file + ": holds no token on its first line";
  }
  auto state_dir = slide::DefaultStateDir();
  if (o->addr.empty()) {
    if (!state_dir.ok()) return "no --addr and " + state_dir.status().message();
    o->addr = "unix:" + state_dir.value() + "/slided.sock";
  }
  if (o->token.empty() && o->addr.rfind("unix:", 0) != 0 && state_dir.ok()) {
    const std::string generated = state_dir.value() + "/token";
    if (::access(generated.c_str(), R_OK) == 0) {
      const std::string text = slidectl::ReadLocalFile(generated, "token file", kMaxSmallFileBytes, &error);
      if (error.empty()) o->token = text.substr(0, text.find('\n'));
    }
  }
  return "";
}

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "slidectl: %s\n", slidectl::Printable(msg).c_str());
  return code;
}

// Everything the daemon sends is shown through Printable (client/terminal_text.h).
std::string Safe(const std::string& text) { return slidectl::Printable(text); }

int RpcError(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return Fail(kUnreachable, s.error_message().empty() ? "cannot reach the daemon" : s.error_message());
    default:
      return Fail(kUsage, s.error_message());
  }
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

void Prepare(grpc::ClientContext& ctx, const Options& o, int seconds) {
  if (!o.token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.token);
  if (seconds > 0) ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

void PrintJob(const v1::Job& j) {
  std::printf("%s  %-10s step %lld/%lld  loss %.4f", Safe(j.id()).c_str(), v1::JobState_Name(j.state()).c_str(),
              static_cast<long long>(j.step()), static_cast<long long>(j.total_steps()), j.loss());
  if (!j.spec().name().empty()) std::printf("  %s", Safe(j.spec().name()).c_str());
  if (j.spec().adapter() == v1::ADAPTER_LORA || j.spec().adapter() == v1::ADAPTER_QLORA)  // the trainable count is
    std::printf("  mode: %s r %lld on %s",  // in the job's log ("mode: LoRA ...")
                j.spec().adapter() == v1::ADAPTER_QLORA ? "qlora" : "lora", static_cast<long long>(j.spec().lora_r()),
                Safe(j.spec().lora_target_modules()).c_str());
  else
    std::printf("  mode: full");
  if (j.trainable_params() > 0 && j.model_params() > 0)  // known once the job has run a step
    std::printf(" (%lld of %lld parameters trained, %.3f%%)", static_cast<long long>(j.trainable_params()),
                static_cast<long long>(j.model_params()),
                100.0 * static_cast<double>(j.trainable_params()) / static_cast<double>(j.model_params()));
  if (!j.error().empty()) std::printf("  error: %s", Safe(j.error()).c_str());
  if (!j.export_dir().empty()) std::printf("  export: %s", Safe(j.export_dir()).c_str());
  std::printf("\n");
}

// With --cancel-on-interrupt, SIGINT is blocked in every thread and taken here: cancel the job; the watch then
// streams on to the job's end (CANCELLED at its next step boundary) and reports it.
class InterruptCancels {
 public:
  InterruptCancels(v1::Slide::Stub& stub, const Options& o, const std::string& id) {
    thread_ = std::thread([&stub, o, id, this] {
      int sig = 0;
      sigwait(&signals_, &sig);
      if (done_) return;
      std::fprintf(stderr, "\nslidectl: interrupted, cancelling %s (Ctrl-C again to stop waiting)\n", Safe(id).c_str());
      grpc::ClientContext c;
      Prepare(c, o, 10);
      v1::CancelJobRequest r;
      r.set_id(id);
      v1::CancelJobResponse resp;
      (void)stub.CancelJob(&c, r, &resp);  // the watch then sees the job end CANCELLED
      sigwait(&signals_, &sig);            // a second Ctrl-C, or the destructor's wake-up
      if (!done_) std::_Exit(130);
    });
  }
  ~InterruptCancels() {
    done_ = true;
    pthread_kill(thread_.native_handle(), SIGINT);  // wakes whichever sigwait the thread is in
    thread_.join();
  }
  static void BlockSigint() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  }

 private:
  static inline sigset_t signals_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Streams a job's events. On a terminal one progress line is redrawn; otherwise one line per step.
int Watch(v1::Slide::Stub& stub, const Options& o, const std::string& id, bool logs_only, int64_t from_step = 0,
          bool cancel_on_interrupt = false) {
  grpc::ClientContext ctx;
  Prepare(ctx, o, 0);
  v1::WatchJobRequest req;
  req.set_id(id);
  req.set_from_step(from_step);
  std::unique_ptr<InterruptCancels> interrupt;
  if (cancel_on_interrupt) interrupt = std::make_unique<InterruptCancels>(stub, o, id);
  auto reader = stub.WatchJob(&ctx, req);
  const bool tty = isatty(fileno(stdout)) && !o.json;
  v1::JobEvent e;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  double first_loss = -1, last_loss = 0;
  int64_t steps = 0;
  auto start = std::chrono::steady_clock::now();
  while (reader->Read(&e)) {
    if (o.json) {
      std::printf("%s\n", Json(e).c_str());
      std::fflush(stdout);
    }
    if (e.kind_case() == v1::JobEvent::kState) state = e.state();
    if (logs_only) {
      if (e.kind_case() == v1::JobEvent::kLog && !o.json) {
        std::printf("%s\n", slidectl::Printable(e.log(), /*keep_newlines=*/true).c_str());
        std::fflush(stdout);  // a running job's lines as they come, also through a pipe
      }
      continue;
    }
    if (e.has_metrics()) {
      const auto& m = e.metrics();
      if (first_loss < 0) first_loss = m.loss();
      last_loss = m.loss();
      steps = m.step();
      if (o.json) continue;
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double eta = m.step() > 0 ? elapsed / m.step() * (m.total_steps() - m.step()) : 0;
      std::printf(
          "%sstep %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  %.1f TFLOPS  ETA %ds  GPU %.1f GiB  host %.1f GiB  "
          "bound: %s%s%s%s",
          tty ? "\r\033[K" : "", static_cast<long long>(m.step()), static_cast<long long>(m.total_steps()), m.loss(),
          m.lr(), m.tokens_per_second(), m.model_tflops(), static_cast<int>(eta), m.device_bytes() / double(1ll << 30),
          m.host_bytes() / double(1ll << 30), Safe(m.bounded_by()).c_str(), m.weights_first() ? "  weights first" : "",
          m.replayed() ? "  (replayed after a restart)" : "", tty ? "" : "\n");
      std::fflush(stdout);
    } else if (!o.json && e.kind_case() == v1::JobEvent::kState && !tty) {
      std::printf("state %s\n", v1::JobState_Name(e.state()).c_str());
    }
  }
  grpc::Status s = reader->Finish();
  interrupt.reset();
  if (!s.ok()) return RpcError(s);
  if (tty) std::printf("\n");
  if (!o.json && !logs_only)
    std::printf("%s %s: %lld steps, loss %.4f -> %.4f\n", Safe(id).c_str(), v1::JobState_Name(state).c_str(),
                static_cast<long long>(steps), first_loss, last_loss);
  if (!logs_only) {
    grpc::ClientContext c;
    Prepare(c, o, 10);
    v1::GetJobRequest g;
    g.set_id(id);
    v1::GetJobResponse job;
    if (stub.GetJob(&c, g, &job).ok() && !o.json) {
      if (!job.job().error().empty()) std::printf("error: %s\n", Safe(job.job().error()).c_str());
      if (!job.job().export_dir().empty()) std::printf("exported model: %s\n", Safe(job.job().export_dir()).c_str());
    }
  }
  return state == v1::SUCCEEDED ? kOk : kJobFailed;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"slidectl: submit and watch fine-tuning jobs on a slided daemon", "slidectl"};
  app.footer(kHelpFooter);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last wins
  app.fallthrough();  // the global flags may also follow the command
  app.add_option("--addr", o.addr,
                 "the daemon's gRPC address: unix:PATH or HOST:PORT (SLIDE_ADDR; default the local daemon's socket)");
  app.add_option("--token", o.token, "bearer token (SLIDE_TOKEN)");
  app.add_option("--token-file", o.token_file, "read the bearer token from the first line of FILE (SLIDE_TOKEN_FILE)");
  app.add_option("--tls-ca", o.tls_ca,
                 "talk TLS to a daemon with security.tls_cert_file set, trusting the CA certificate in FILE "
                 "(SLIDE_TLS_CA)");
  app.add_flag("--json", o.json, "print the API's JSON instead of text");
  std::string file, id, state;
  int64_t from_step = 0;
  bool follow = false, cancel_on_interrupt = false;
  auto* submit = app.add_subcommand("submit", "submit a job (FILE.yaml: fields of slide.v1.JobSpec)");
  submit->add_option("FILE.yaml", file, "the job file")->required();
  submit->add_flag("--follow", follow, "watch the job to the end");
  auto* watch =
      app.add_subcommand("watch", "follow a job: progress, then a summary; Ctrl-C detaches and the job goes on");
  auto* logs = app.add_subcommand("logs", "print a job's log lines");
  for (CLI::App* c : {watch, logs}) {
    c->add_option("ID", id, "the job id")->required();
    c->add_option("--from-step", from_step, "skip the metrics of earlier steps");
  }
  for (CLI::App* c : {submit, watch})
    c->add_flag("--cancel-on-interrupt", cancel_on_interrupt, "Ctrl-C cancels the job before detaching");
  auto* list = app.add_subcommand("list", "list jobs");
  list->add_option("--state", state, "only jobs in STATE (QUEUED, PREPARING, RUNNING, SUCCEEDED, FAILED, CANCELLED)");
  auto* get = app.add_subcommand("get", "show one job");
  auto* cancel = app.add_subcommand("cancel", "cancel a queued or running job");
  for (CLI::App* c : {get, cancel}) c->add_option("ID", id, "the job id")->required();
  auto* status = app.add_subcommand("status", "the daemon's state and queue");
  slidectl::RenderOptions render_options;
  auto* render = app.add_subcommand(
      "render", "show how the job's first dataset lines are rendered and which tokens are trained (read locally)");
  render->add_option("FILE.yaml", file, "the job file")->required();
  render->add_option("--line", render_options.first_line, "start at this line of the dataset (1-based)");
  render->add_option("--lines", render_options.lines, "how many lines to show (default 3)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());  // the command's own help when one was named
    return kOk;
  } catch (const CLI::ParseError& e) {
    // Unknown flags, stray words, missing or malformed values: one line naming them.
    return Fail(kUsage, std::string(e.what()) + " (see --help)");
  }
  if (app.get_subcommands().empty()) return Fail(kUsage, "no command (see --help)");
  CLI::App* const cmd = app.get_subcommands().front();
  if (cmd == render) {  // local: no daemon involved
    v1::JobSpec spec;
    if (const std::string err = slidectl::LoadJobFile(file, &spec); !err.empty()) return Fail(kUsage, err);
    render_options.color = isatty(STDOUT_FILENO) != 0 && Env("NO_COLOR").empty();
    const std::string err = slidectl::RenderJobLines(spec, render_options);
    return err.empty() ? kOk : Fail(kUsage, err);
  }
  const bool watches = cmd == watch || (cmd == submit && follow);
  // Before any gRPC thread exists, so that only the watcher's sigwait sees Ctrl-C.
  if (cancel_on_interrupt && watches) InterruptCancels::BlockSigint();
  if (const std::string error = ResolveConnection(&o); !error.empty()) return Fail(kUsage, error);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!o.tls_ca.empty()) {
    std::string error;
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = slidectl::ReadLocalFile(o.tls_ca, "CA certificate", kMaxSmallFileBytes, &error);
    if (!error.empty()) return Fail(kUsage, error);
    creds = grpc::SslCredentials(tls);
  }
  auto stub = v1::Slide::NewStub(grpc::CreateChannel(o.addr, creds));

  if (cmd == submit) {
    v1::SubmitJobRequest req;
    const std::string err = slidectl::LoadJobFile(file, req.mutable_spec());
    if (!err.empty()) return Fail(kUsage, err);
    grpc::ClientContext ctx;
    Prepare(ctx, o, 30);
    v1::SubmitJobResponse resp;
    grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
    if (!s.ok()) return RpcError(s);
    if (o.json && !follow) std::printf("%s\n", Json(resp.job()).c_str());
    if (!o.json) std::printf("submitted %s\n", Safe(resp.job().id()).c_str());
    return follow ? Watch(*stub, o, resp.job().id(), false, 0, cancel_on_interrupt) : kOk;
  }
  if (cmd == watch || cmd == logs) return Watch(*stub, o, id, cmd == logs, from_step, cancel_on_interrupt);
  if (cmd == get || cmd == cancel) {
    grpc::ClientContext ctx;
    Prepare(ctx, o, 30);
    v1::Job job;
    grpc::Status s;
    if (cmd == get) {
      v1::GetJobRequest r;
      r.set_id(id);
      v1::GetJobResponse resp;
      s = stub->GetJob(&ctx, r, &resp);
      job = resp.job();
    } else {
      v1::CancelJobRequest r;
      r.set_id(id);
      v1::CancelJobResponse resp;
      s = stub->CancelJob(&ctx, r, &resp);
      job = resp.job();
    }
    if (!s.ok()) return RpcError(s);
    o.json ? (void)std::printf("%s\n", Json(job).c_str()) : PrintJob(job);
    return kOk;
  }
  if (cmd == list) {
    v1::ListJobsRequest r;
    if (!state.empty()) {
      v1::JobState st;
      if (!v1::JobState_Parse(state, &st)) return Fail(kUsage, "unknown state '" + state + "'");
      r.set_state(st);
    }
    v1::ListJobsResponse all;
    do {
      grpc::ClientContext ctx;
      Prepare(ctx, o, 30);
      v1::ListJobsResponse page;
      grpc::Status s = stub->ListJobs(&ctx, r, &page);
      if (!s.ok()) return RpcError(s);
      for (const auto& j : page.jobs()) *all.add_jobs() = j;
      r.set_page_token(page.next_page_token());
    } while (!r.page_token().empty());
    if (o.json) {
      std::printf("%s\n", Json(all).c_str());
    } else {
      for (const auto& j : all.jobs()) PrintJob(j);
    }
    return kOk;
  }
  if (cmd == status) {
    grpc::ClientContext ctx;
    Prepare(ctx, o, 10);
    v1::GetServerStatusRequest r;
    v1::ServerStatus st;
    grpc::Status s = stub->GetServerStatus(&ctx, r, &st);
    if (!s.ok()) return RpcError(s);
    if (o.json) {
      std::printf("%s\n", Json(st).c_str());
    } else {
      const double gib = double(1ll << 30);
      std::printf("slided %s at %s on %s: %d queued, running: %s%s\n", Safe(st.version()).c_str(), Safe(o.addr).c_str(),
                  Safe(st.device()).c_str(), st.queued_jobs(),
                  st.running_job().empty() ? "none" : Safe(st.running_job()).c_str(),
                  st.draining() ? " (draining)" : "");
      std::printf("  gpu memory: %.2f GiB reserved of a %.2f GiB job budget (device %.1f GiB)\n",
                  st.device_reserved_bytes() / gib, st.gpu_budget_bytes() / gib, st.device_memory_bytes() / gib);
      std::printf("  host memory: %.2f GiB resident (fp32 master, moments and pinned staging of the running job)\n",
                  st.host_resident_bytes() / gib);
      std::printf("  jobs: %d in %s\n", st.jobs_total(), Safe(st.state_dir()).c_str());
    }
    return kOk;
  }
  return Fail(kUsage, "no such command (see --help)");
}
