// MetricsHttpServer: serves GET /metrics (Prometheus text format) from a prometheus-cpp registry, through
// cpp-httplib (Debian's libcpp-httplib): a pool of worker threads, one connection each, with read, write and
// keep-alive timeouts, so an idle or slow client holds one worker for at most a couple of seconds and never
// delays a scrape behind it. (prometheus-cpp's own Exposer cannot be used: its CivetWeb threads get a fixed
// 100 KiB stack, smaller than the static TLS of a process that loads LibTorch + CUDA.)
#pragma once

#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <thread>

#include "engine/common/status.h"

namespace httplib {
class Server;
}

namespace slide {

struct MetricsHttpOptions {
  int worker_threads = 16;     // connections served at once
  int io_timeout_seconds = 2;  // to read a request, to write a response, and a kept-alive connection's idle time
};

class MetricsHttpServer {
 public:
  explicit MetricsHttpServer(std::shared_ptr<prometheus::Registry> registry, MetricsHttpOptions options = {});
  ~MetricsHttpServer();

  // Binds HOST:PORT (an IPv4 address or "localhost"; port 0 picks one) and starts serving; the bound port.
  StatusOr<int> Start(const std::string& listen);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  MetricsHttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace slide
