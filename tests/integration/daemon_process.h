// A real slided process for integration tests: started on 127.0.0.1:0, its port read from --port-file,
// killed (SIGKILL) on destruction unless Terminate() stopped it.
#pragma once

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "slide/v1/slide.grpc.pb.h"

namespace slide::testing {

namespace fs = std::filesystem;
namespace v1 = slide::v1;

class Daemon {
 public:
  Daemon() {
    dir_ = fs::temp_directory_path() / ("slided-test-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(dir_);
    const std::string port_file = (dir_ / "port").string();
    pid_ = fork();
    if (pid_ == 0) {
      execl(SLIDED_PATH, SLIDED_PATH, "--listen", "127.0.0.1:0", "--port-file", port_file.c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 300 && !fs::exists(port_file); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream(port_file) >> port_;
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials());
    stub_ = v1::Slide::NewStub(channel_);
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // SIGTERM and the exit status (-1 if it did not exit within `seconds`).
  int Terminate(int seconds) {
    kill(pid_, SIGTERM);
    for (int i = 0; i < seconds * 20; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  v1::Slide::Stub& stub() { return *stub_; }
  int port() const { return port_; }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Slide::Stub> stub_;
};

}  // namespace slide::testing
