// MetricsHttpServer: serves GET /metrics (Prometheus text format) from a prometheus-cpp registry on its own
// port, one connection at a time on one thread. prometheus-cpp's own Exposer runs CivetWeb, whose worker
// threads are created with a fixed 100 KiB stack: in a process that loads LibTorch + CUDA, the static TLS is
// larger than that and pthread_create fails (EINVAL), so the daemon cannot use it.
#pragma once

#include <prometheus/registry.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "engine/common/status.h"

namespace slide {

class MetricsHttpServer {
 public:
  explicit MetricsHttpServer(std::shared_ptr<prometheus::Registry> registry) : registry_(std::move(registry)) {}
  ~MetricsHttpServer();

  // Binds HOST:PORT (an IPv4 address or "localhost"; port 0 picks one) and starts serving; the bound port.
  StatusOr<int> Start(const std::string& listen);

 private:
  void Serve();
  void Answer(int fd);

  std::shared_ptr<prometheus::Registry> registry_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace slide
