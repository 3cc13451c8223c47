#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

namespace slide {

MetricsHttpServer::~MetricsHttpServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

StatusOr<int> MetricsHttpServer::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("metrics address '" + listen + "' is not HOST:PORT");
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty() || host == "*") host = "0.0.0.0";
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
    return InvalidArgument("metrics address '" + listen + "' has no port number");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (port < 0 || port > 65535 || ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return InvalidArgument("metrics address '" + listen + "' is not an IPv4 HOST:PORT");
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(addr);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 64) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return InvalidArgument("cannot serve metrics on '" + listen + "': " + std::strerror(errno));
  thread_ = std::thread([this] { Serve(); });
  return static_cast<int>(ntohs(addr.sin_port));
}

void MetricsHttpServer::Serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;  // wakes up to notice stop_
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval timeout{2, 0};  // per send; the request as a whole has its own deadline in Answer
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    Answer(fd);
    ::close(fd);
  }
}

void MetricsHttpServer::Answer(int fd) {
  std::string request;
  char buf[2048];
  // A client has 2 s in all to send its request: a slow one cannot hold the endpoint or delay shutdown.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (stop_ || left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (line.rfind("GET /metrics ", 0) == 0 || line.rfind("GET /metrics?", 0) == 0) {
    body = prometheus::TextSerializer().Serialize(registry_->Collect());
  } else if (line.rfind("GET ", 0) == 0) {
    status = "404 Not Found";
    type = "text/plain";
    body = "slided serves /metrics\n";
  } else {
    status = "405 Method Not Allowed";
    type = "text/plain";
  }
  std::ostringstream out;
  out << "HTTP/1.1 " << status << "\r\nContent-Type: " << type << "\r\nContent-Length: " << body.size()
      << "\r\nConnection: close\r\n\r\n"
      << body;
  const std::string response = out.str();
  size_t done = 0;
  while (done < response.size()) {
    const ssize_t n = ::send(fd, response.data() + done, response.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace slide
