// slided: the fine-tuning daemon. Serves slide.v1.Slide, the standard health service and reflection.
// Flags: --listen ADDR (default 127.0.0.1:50151; port 0 picks one), --port-file PATH (the bound port is
// written there once serving). SIGTERM/SIGINT: stop accepting, cancel the running job at its next step,
// finish streams, exit within 10 s.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "server/slide_service.h"

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:50151", port_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else if (a == "--port-file" && i + 1 < argc) {
      port_file = argv[++i];
    } else if (a == "--help") {
      std::printf("usage: slided [--listen HOST:PORT] [--port-file PATH]\n");
      return 0;
    } else {
      std::fprintf(stderr, "slided: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  // Signals are taken by one thread with sigwait, never in a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  slide::JobManager jobs;
  slide::SlideService service(jobs);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "slided: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  if (!port_file.empty()) {
    std::ofstream(port_file + ".tmp") << port << "\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  }
  std::fprintf(stderr, "slided: serving on %s (port %d)\n", listen.c_str(), port);

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "slided: %s, draining\n", strsignal(sig));
    service.SetDraining();
    server->GetHealthCheckService()->SetServingStatus(false);
    jobs.Shutdown();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  });
  server->Wait();
  waiter.join();
  std::fprintf(stderr, "slided: stopped\n");
  return 0;
}
