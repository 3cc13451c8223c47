// A real slided process for integration tests: gRPC on its owner-only unix socket in the test's directory (or on
// 127.0.0.1:0 with `tcp`, where the daemon then wants a token: token_env, or the one it generates into its state
// directory, token()), metrics on 127.0.0.1:0, ports read from the port files, its state in a temporary directory
// (or a given one, to restart on the same state), killed (SIGKILL) on destruction unless Terminate() or Kill()
// stopped it.
#pragma once

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/enum_short_names.h"
#include "slide/v1/slide.grpc.pb.h"

namespace slide::testing {

namespace fs = std::filesystem;
namespace v1 = slide::v1;

struct DaemonOptions {
  std::string state_dir;                // empty: a fresh directory of this Daemon
  std::vector<std::string> extra_args;  // e.g. --config FILE
  std::string token_env;                // SLIDE_TOKEN for the process
  bool wait_for_port = true;
  bool tcp = false;  // gRPC on 127.0.0.1:0 instead of the unix socket
};

class Daemon {
 public:
  explicit Daemon(DaemonOptions options = {}) {
    dir_ = fs::temp_directory_path() / ("slided-test-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(dir_);
    state_dir_ = options.state_dir.empty() ? (dir_ / "state").string() : options.state_dir;
    const std::string port_file = (dir_ / "port").string(), metrics_file = (dir_ / "metrics-port").string();
    const std::string log = (dir_ / "slided.log").string();
    socket_ = (dir_ / "slided.sock").string();
    std::vector<std::string> args = {SLIDED_PATH,
                                     "--listen",
                                     options.tcp ? "127.0.0.1:0" : "unix:" + socket_,
                                     "--port-file",
                                     port_file,
                                     "--state-dir",
                                     state_dir_,
                                     "--metrics-listen",
                                     "127.0.0.1:0",
                                     "--metrics-port-file",
                                     metrics_file};
    args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
    pid_ = fork();
    if (pid_ == 0) {
      if (options.token_env.empty()) {
        unsetenv("SLIDE_TOKEN");
      } else {
        setenv("SLIDE_TOKEN", options.token_env.c_str(), 1);
      }
      if (std::FILE* f = std::freopen(log.c_str(), "w", stderr); f == nullptr) _exit(126);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(SLIDED_PATH, argv.data());
      _exit(127);
    }
    if (!options.wait_for_port) return;
    for (int i = 0; i < 600 && !fs::exists(metrics_file); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (Exited()) return;
    }
    std::ifstream(port_file) >> port_;
    std::ifstream(metrics_file) >> metrics_port_;
    addr_ = options.tcp ? "127.0.0.1:" + std::to_string(port_) : "unix:" + socket_;
    channel_ = grpc::CreateChannel(addr_, grpc::InsecureChannelCredentials());
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
  // True once the process has exited (its status then in exit_status()).
  bool Exited() {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return pid_ <= 0;
  }
  // Waits up to `seconds` for the process to exit by itself; its status, or -1.
  int WaitExit(int seconds) {
    for (int i = 0; i < seconds * 20; ++i) {
      if (Exited()) return exit_status_;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  void Kill() {  // kill -9: no chance to checkpoint or flush
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  std::string Log() const {
    std::ifstream in(dir_ / "slided.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  const std::string& state_dir() const { return state_dir_; }
  int metrics_port() const { return metrics_port_; }
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
  int port() const { return port_; }  // > 0 once the daemon serves (the TCP port; for the socket what gRPC reports)
  const std::string& addr() const { return addr_; }  // for slidectl --addr and new channels
  std::string socket_path() const { return socket_; }
  // The token a TCP daemon generated into its state directory ("" when there is none).
  std::string token() const {
    std::string t;
    std::ifstream(state_dir_ + "/token") >> t;
    return t;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path dir_;
  std::string state_dir_, socket_, addr_;
  pid_t pid_ = -1;
  int port_ = 0, metrics_port_ = 0, exit_status_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Slide::Stub> stub_;
};

// The bundled demo job (deploy/demo), on the CPU. For measurements on the GPU box the environment can swap in
// a real-size job: SLIDE_TEST_DEVICE (cuda), SLIDE_TEST_MODEL_DIR (e.g. from bench/make_random_model),
// SLIDE_TEST_BATCH, SLIDE_TEST_SEQ.
inline v1::JobSpec DemoJobSpec(const std::string& out, int steps) {
  auto env = [](const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v != nullptr && v[0] != '\0' ? std::string(v) : fallback;
  };
  v1::JobSpec s;
  s.set_name("demo");
  s.set_model_dir(env("SLIDE_TEST_MODEL_DIR", std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/model"));
  s.set_dataset(std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/train.jsonl");
  s.set_output_dir(out);
  s.set_steps(steps);
  s.set_batch_size(std::stoi(env("SLIDE_TEST_BATCH", "16")));
  s.set_seq_len(std::stoi(env("SLIDE_TEST_SEQ", "32")));
  s.set_sequence_mode(v1::SEQUENCE_MODE_TRUNCATE);
  s.set_lr(3e-3);
  s.set_warmup_steps(2);
  const auto* device = v1::FindEnumValueByShortName(v1::Device_descriptor(), env("SLIDE_TEST_DEVICE", "cpu"));
  s.set_device(device != nullptr ? static_cast<v1::Device>(device->number()) : v1::DEVICE_UNSPECIFIED);
  return s;
}

}  // namespace slide::testing
