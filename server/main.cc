// slided: the fine-tuning daemon. Serves slide.v1.Slide, the standard health service, reflection and
// Prometheus /metrics. Configuration: embedded defaults < --config FILE < flags (see --help). SIGTERM/SIGINT:
// stop accepting, checkpoint the running job at its next step boundary (it resumes on the next start),
// finish streams, exit within server.shutdown_deadline_seconds.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/stat.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <thread>

#include "engine/common/files.h"
#include "engine/engine.h"
#include "server/daemon_config.h"
#include "server/daemon_metrics.h"
#include "server/job_store.h"
#include "server/log.h"
#include "server/slide_service.h"

namespace {

// Below the generated flag list.
constexpr char kHelpFooter[] =
    "With no file slided runs on its embedded defaults (--print-default-config shows them): gRPC on the\n"
    "owner-only socket unix:<state dir>/slided.sock, metrics on 127.0.0.1:9464, state under\n"
    "$XDG_DATA_HOME/slideformer or ~/.local/share/slideformer. Port 0 picks a free port. TCP (--listen HOST:PORT)\n"
    "always needs a bearer token: security.token, security.token_file or SLIDE_TOKEN, else one is generated into\n"
    "<state dir>/token. Log lines go to stderr with a\n"
    "UTC time and a level (server.log_level, default info; debug adds every job's own log lines).";

int Fail(const std::string& message) {
  slide::LogError(message);
  return 2;
}

void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  slide::Status st = slide::WriteFileAtomic(path, std::to_string(port) + "\n");
  if (!st.ok()) slide::LogError(st.ToString());
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, listen, metrics_listen, state_dir, port_file, metrics_port_file, log_level;
  bool check_only = false, print_defaults = false;
  CLI::App app{"slided: the slideformer daemon (configuration: embedded defaults < --config FILE < flags)", "slided"};
  app.footer(kHelpFooter);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated flag: the last wins
  app.add_option("--config", config_path,
                 "YAML file overlaying the defaults (sections server, storage, security, "
                 "jobs, nvme)");
  app.add_option("--listen", listen, "gRPC address HOST:PORT");
  app.add_option("--metrics-listen", metrics_listen, "Prometheus /metrics address HOST:PORT, or off");
  app.add_option("--state-dir", state_dir, "job records, event logs and checkpoints");
  app.add_option("--port-file", port_file, "receives the bound gRPC port (useful with port 0)");
  app.add_option("--metrics-port-file", metrics_port_file, "receives the bound metrics port");
  app.add_option("--log-level", log_level, "debug, info, warning or error");
  app.add_flag("--check-config", check_only,
               "validate the configuration (file, flags, token rule, addresses) and exit 0 without starting");
  app.add_flag("--print-default-config", print_defaults, "print the embedded defaults as YAML and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {  // unknown flags, stray words, missing values: one line naming them
    return Fail(std::string(e.what()) + " (see --help)");
  }
  if (print_defaults) {
    std::printf("%s", slide::kDefaultDaemonConfigYaml);
    return 0;
  }
  auto loaded = slide::LoadDaemonConfig(config_path);
  if (!loaded.ok()) return Fail(loaded.status().message());
  slide::DaemonConfig config = std::move(loaded).value();
  if (!listen.empty()) config.listen = listen;
  if (!metrics_listen.empty()) config.metrics_listen = metrics_listen == "off" ? "" : metrics_listen;
  if (!state_dir.empty()) config.state_dir = state_dir;
  if (!log_level.empty()) config.log_level = log_level;
  if (slide::Status st = slide::FinalizeDaemonConfig(&config); !st.ok()) return Fail(st.message());
  slide::SetLogLevel(*slide::ParseLogLevel(config.log_level));  // FinalizeDaemonConfig checked the name
  if (check_only) {
    std::printf("slided: configuration OK (listen %s, metrics %s, state %s)\n", config.listen.c_str(),
                config.metrics_listen.empty() ? "off" : config.metrics_listen.c_str(), config.state_dir.c_str());
    return 0;
  }

  // Signals are taken by one thread with sigwait, never in a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Every thread started from here on inherits the mask, so only the waiter below sees SIGTERM/SIGINT.
  // The state directory first: its lock decides whether this daemon may run at all.
  slide::DirectoryJobStore store(config.state_dir);
  if (slide::Status st = store.Init(); !st.ok()) return Fail("state directory: " + st.message());
  auto generated = slide::EnsureTcpToken(&config);
  if (!generated.ok()) return Fail("security: " + generated.status().message());
  if (generated.value())
    slide::LogInfo("listening on TCP without a configured token: generated one into " + config.state_dir + "/" +
                   slide::kGeneratedTokenName + " (slidectl run as this user reads it)");

  const std::unique_ptr<slide::Engine> engine = slide::MakeLocalEngine();
  const slide::EngineDescription machine = engine->Describe();
  slide::DaemonMetrics metrics("0.1.0", config.gpu_budget_bytes, machine.device_total_bytes, machine.host_budget_bytes);
  int metrics_port = 0;
  if (!config.metrics_listen.empty()) {
    auto port = metrics.Serve(config.metrics_listen);
    if (!port.ok()) return Fail(port.status().message());
    metrics_port = port.value();
  }

  slide::JobManagerOptions jm;
  jm.engine = engine.get();
  jm.max_events_per_job = static_cast<size_t>(config.max_events_per_job);
  jm.store = &store;
  jm.default_checkpoint_every = config.checkpoint_every;
  jm.default_gpu_budget_bytes = config.gpu_budget_bytes;
  jm.max_interrupted_runs = config.max_interrupted_runs;
  jm.observer = &metrics;
  jm.allowed_roots = config.allowed_roots;
  jm.nvme.io.dirs = config.nvme_dirs;
  jm.nvme.io.backend = config.nvme_backend;
  jm.nvme.io.queue_depth = static_cast<unsigned>(config.nvme_queue_depth);
  jm.nvme.io.io_threads = static_cast<int>(config.nvme_io_threads);
  jm.nvme.io.request_bytes = static_cast<size_t>(config.nvme_request_bytes);
  jm.nvme.chunk_bytes = static_cast<size_t>(config.nvme_chunk_bytes);
  jm.nvme.buffers = static_cast<int>(config.nvme_buffers);
  for (const auto& dir : config.nvme_dirs)  // a daemon killed mid-job leaves its jobs' tier files behind
    if (const int n = engine->RemoveStaleTierFiles(dir); n > 0)
      slide::LogWarning("removed " + std::to_string(n) + " NVMe tier file(s) an earlier run left in " + dir);
  std::vector<std::string> problems;
  slide::JobManager jobs(jm, &problems);
  for (const auto& p : problems) slide::LogWarning("skipped unreadable job state: " + p);

  slide::ServiceOptions so;
  so.token = config.token;
  so.gpu_budget_bytes = config.gpu_budget_bytes;
  so.state_dir = config.state_dir;
  slide::SlideService service(jobs, *engine, so);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!config.tls_cert_file.empty()) {
    auto cert = slide::ReadFileToString(config.tls_cert_file);
    auto key = slide::ReadFileToString(config.tls_key_file);
    if (!cert.ok()) return Fail("security.tls_cert_file: " + cert.status().message());
    if (!key.ok()) return Fail("security.tls_key_file: " + key.status().message());
    grpc::SslServerCredentialsOptions tls;
    tls.pem_key_cert_pairs.push_back({key.value(), cert.value()});
    creds = grpc::SslServerCredentials(tls);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, creds, &port);
  builder.RegisterService(&service);
  const bool on_socket = !slide::ListensOnTcp(config);
  // The socket is created owner-only (umask around the bind, chmod after as well): only this daemon's user can
  // connect, so only it can submit jobs that this daemon then runs with its rights.
  const mode_t old_umask = on_socket ? ::umask(0177) : ::umask(0022);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ::umask(old_umask);
  if (!server || port == 0) return Fail("cannot listen on " + config.listen);
  if (on_socket && ::chmod(config.listen.substr(5).c_str(), 0600) != 0)
    return Fail("cannot make " + config.listen + " owner-only: " + std::strerror(errno));
  // Probes may ask for the whole server ("") or for the service by name.
  server->GetHealthCheckService()->SetServingStatus(slide::v1::Slide::service_full_name(), true);
  server->GetHealthCheckService()->SetServingStatus(true);
  WritePortFile(port_file, port);
  WritePortFile(metrics_port_file, metrics_port);
  slide::LogInfo("serving on " + config.listen +
                 (on_socket ? std::string(" (owner-only socket") : " (port " + std::to_string(port)) +
                 (config.tls_cert_file.empty() ? "" : ", TLS") + (config.token.empty() ? "" : ", bearer token") +
                 "), metrics on " + (config.metrics_listen.empty() ? "off" : "port " + std::to_string(metrics_port)) +
                 ", state in " + config.state_dir + ", device " + machine.device);

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    slide::LogInfo(std::string(strsignal(sig)) + ", draining");
    const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(config.shutdown_deadline_seconds);
    service.SetDraining();
    server->GetHealthCheckService()->SetServingStatus(false);
    // The running job checkpoints at its next step boundary; past the deadline the process exits anyway and
    // the job resumes from its previous checkpoint.
    auto drained = std::async(std::launch::async, [&] { jobs.Shutdown(); });
    if (drained.wait_until(deadline) != std::future_status::ready) {
      slide::LogError("the running job did not reach a step boundary before the deadline");
      std::_Exit(1);
    }
    server->Shutdown(deadline);
  });
  server->Wait();
  waiter.join();
  slide::LogInfo("stopped");
  return 0;
}
