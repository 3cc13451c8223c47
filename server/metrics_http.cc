#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <prometheus/text_serializer.h>

namespace slide {

MetricsHttpServer::MetricsHttpServer(std::shared_ptr<prometheus::Registry> registry, MetricsHttpOptions options)
    : registry_(std::move(registry)), options_(options) {}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

StatusOr<int> MetricsHttpServer::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("metrics address '" + listen + "' is not HOST:PORT");
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty() || host == "*") host = "0.0.0.0";
  const std::string port_text = listen.substr(colon + 1);
  in_addr v4{};
  if (port_text.empty() || port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port_text) > 65535 || ::inet_pton(AF_INET, host.c_str(), &v4) != 1)
    return InvalidArgument("metrics address '" + listen + "' is not an IPv4 HOST:PORT");

  server_ = std::make_unique<httplib::Server>();
  const int workers = options_.worker_threads;
  server_->new_task_queue = [workers] { return new httplib::ThreadPool(static_cast<size_t>(workers)); };
  server_->set_read_timeout(options_.io_timeout_seconds, 0);
  server_->set_write_timeout(options_.io_timeout_seconds, 0);
  server_->set_keep_alive_timeout(options_.io_timeout_seconds);
  server_->set_payload_max_length(16 << 10);  // a scrape sends no body
  auto registry = registry_;
  server_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(registry->Collect()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404 && req.method == "GET") res.set_content("slided serves /metrics\n", "text/plain");
  });
  const int port = std::stoi(port_text);
  const int bound_port = port == 0 ? server_->bind_to_any_port(host) : server_->bind_to_port(host, port) ? port : -1;
  if (bound_port <= 0) {
    server_.reset();
    return InvalidArgument("cannot serve metrics on '" + listen + "' (the address is taken or not this machine's)");
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return bound_port;
}

}  // namespace slide
