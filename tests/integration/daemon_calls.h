// Calls the daemon integration tests share: submit, get, poll until a condition, read every event of a job, ask
// the health service (gRPC), and a plain HTTP GET for /metrics.
#pragma once

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "slide/v1/slide.grpc.pb.h"
#include "tests/integration/daemon_process.h"

namespace slide::testing {

inline std::string Submit(Daemon& d, const v1::JobSpec& spec, grpc::Status* status = nullptr) {
  grpc::ClientContext c;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobResponse resp;
  grpc::Status s = d.stub().SubmitJob(&c, req, &resp);
  if (status != nullptr) *status = s;
  return resp.job().id();
}

inline v1::Job Get(Daemon& d, const std::string& id) {
  grpc::ClientContext c;
  v1::GetJobRequest g;
  g.set_id(id);
  v1::GetJobResponse r;
  EXPECT_TRUE(d.stub().GetJob(&c, g, &r).ok());
  return r.job();
}

// Polls GetJob until `done` holds (or ~`seconds` pass); the last record.
inline v1::Job WaitFor(Daemon& d, const std::string& id, const std::function<bool(const v1::Job&)>& done, int seconds) {
  v1::Job j;
  for (int i = 0; i < seconds * 20; ++i) {
    j = Get(d, id);
    if (done(j)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return j;
}

inline std::vector<v1::JobEvent> Events(Daemon& d, const std::string& id) {
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  v1::WatchJobRequest w;
  w.set_id(id);
  auto reader = d.stub().WatchJob(&c, w);
  std::vector<v1::JobEvent> out;
  v1::JobEvent e;
  while (reader->Read(&e)) out.push_back(e);
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  return out;
}

inline const std::string kDemo = std::string(SLIDE_SOURCE_DIR) + "/deploy/demo";

inline bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A copy of the demo model in `dir`, with `linked` (if any) a symlink to `target` instead of a copy.
inline void CopyDemoModel(const fs::path& dir, const std::string& linked = "", const std::string& target = "") {
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(kDemo + "/model")) {
    const std::string name = entry.path().filename().string();
    if (name == linked) {
      fs::create_symlink(target, dir / name);
    } else {
      fs::copy_file(entry.path(), dir / name);
    }
  }
}

inline v1::Job WaitFinal(Daemon& d, const std::string& id) {
  return WaitFor(
      d, id,
      [](const v1::Job& j) {
        return j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED;
      },
      120);
}

// A temporary directory named for the test, removed with its contents.
class Scratch {
 public:
  explicit Scratch(const std::string& tag)
      : dir_(fs::temp_directory_path() / ("slided-" + tag + "-" + std::to_string(getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path operator/(const std::string& name) const { return dir_ / name; }
  std::string str() const { return dir_.string(); }

 private:
  fs::path dir_;
};

// The health service's answer for `service` ("" = the whole server).
inline grpc::health::v1::HealthCheckResponse::ServingStatus Health(Daemon& d, const std::string& service = "") {
  auto channel = grpc::CreateChannel(d.addr(), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext c;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&c, req, &resp).ok()) return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  return resp.status();
}

// GET http://127.0.0.1:port/path; the body ("" on failure).
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

}  // namespace slide::testing
