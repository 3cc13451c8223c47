// run_set: runs a named set of benchmark runs kept as data (bench/runs/NAME.yaml) and collects what they measured.
// Each run is a command (words; "{bin}" is the build directory, "{out}" the output directory) with a timeout and
// optional environment; the set may give a time budget after which no run starts. Every JSON line a run prints on
// stdout goes to OUT/bench.jsonl, labelled first with the commit, the date, the hardware and the run's name; its
// other output goes to OUT/bench.err. A run that fails or times out is reported and the set goes on.
//   run_set SET.yaml --out DIR --commit HASH --hardware TEXT [--bin DIR]
//   run_set SET.yaml --list build|setup     the targets to build / the setup steps the set needs, one line
// The set file:
//   about: what it measures
//   build: [sliding_bench]         targets the runs need
//   setup: [deepspeed]             optional: steps bench/run_gpu.sh takes before the runs
//   budget_s: 560                  optional: no run starts after this many seconds
//   runs:
//     - name: ours-llama-8b-48
//       timeout_s: 240
//       env: {SLIDE_TEST_DEVICE: cuda}
//       command: ["{bin}/bench/sliding_bench", llama-8b, 48, --checkpoints, host]
#include <yaml-cpp/yaml.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using Json = nlohmann::ordered_json;

struct Run {
  std::string name;
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  int timeout_s = 300;
};

struct RunSet {
  std::vector<std::string> build, setup;
  double budget_s = 0;  // 0: none
  std::vector<Run> runs;
};

std::vector<std::string> Strings(const YAML::Node& node) {
  std::vector<std::string> out;
  if (node)
    for (const auto& item : node) out.push_back(item.as<std::string>());
  return out;
}

RunSet Load(const std::string& path) {
  const YAML::Node root = YAML::LoadFile(path);
  RunSet set;
  set.build = Strings(root["build"]);
  set.setup = Strings(root["setup"]);
  if (root["budget_s"]) set.budget_s = root["budget_s"].as<double>();
  for (const auto& r : root["runs"]) {
    Run run;
    run.name = r["name"].as<std::string>();
    run.command = Strings(r["command"]);
    if (run.command.empty()) throw std::runtime_error("run '" + run.name + "' has no command");
    if (r["timeout_s"]) run.timeout_s = r["timeout_s"].as<int>();
    if (r["env"])
      for (const auto& kv : r["env"]) run.env[kv.first.as<std::string>()] = kv.second.as<std::string>();
    set.runs.push_back(std::move(run));
  }
  return set;
}

std::string Substitute(std::string word, const std::string& bin, const std::string& out) {
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"{bin}", bin}, {"{out}", out}})
    for (size_t at = word.find(key); at != std::string::npos; at = word.find(key, at + value.size()))
      word.replace(at, key.size(), value);
  return word;
}

std::string UtcNow() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%FT%TZ", &tm);
  return buf;
}

// Runs `argv` in its own process group with `env` added, its stdout into `lines`, its stderr appended to `err_path`;
// kills the group after `timeout_s`. Returns the exit status as the shell would print it (128 + signal).
int Execute(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, int timeout_s,
            const std::string& err_path, std::vector<std::string>* lines) {
  int out_pipe[2];
  if (pipe(out_pipe) != 0) return 127;
  const pid_t pid = fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_pipe[1], STDOUT_FILENO);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (err >= 0) dup2(err, STDERR_FILENO);
    close(out_pipe[0]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "run_set: cannot run %s\n", args[0]);
    _exit(127);
  }
  close(out_pipe[1]);
  setpgid(pid, pid);
  std::thread killer([pid, timeout_s] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (kill(pid, 0) != 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    kill(-pid, SIGKILL);
  });
  std::string pending;
  char buf[4096];
  for (ssize_t n; (n = read(out_pipe[0], buf, sizeof buf)) > 0;) pending.append(buf, static_cast<size_t>(n));
  close(out_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  killer.join();
  for (size_t start = 0; start < pending.size();) {
    const size_t end = std::min(pending.find('\n', start), pending.size());
    lines->push_back(pending.substr(start, end - start));
    start = end + 1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
  std::string set_path, out = ".", commit, hardware, bin = "build-gpu", list;
  std::vector<std::string> only;
  double budget_s = -1;
  CLI::App app{"run_set: a named set of benchmark runs, their JSON lines labelled into OUT/bench.jsonl", "run_set"};
  app.add_option("set", set_path, "bench/runs/NAME.yaml")->required()->check(CLI::ExistingFile);
  app.add_option("--out", out, "output directory");
  app.add_option("--commit", commit, "the commit of the tree being run");
  app.add_option("--hardware", hardware, "the box, in words");
  app.add_option("--bin", bin, "the build directory {bin} stands for");
  app.add_option("--list", list, "print the set's build targets or setup steps and exit")
      ->check(CLI::IsMember({"build", "setup"}));
  app.add_option("--only", only, "run just these runs, by name (a set split over two device calls)")->delimiter(',');
  app.add_option("--budget", budget_s, "seconds after which no run starts, in place of the set's budget_s (0: none)");
  CLI11_PARSE(app, argc, argv);
  RunSet set;
  try {
    set = Load(set_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run_set: %s: %s\n", set_path.c_str(), e.what());
    return 2;
  }
  if (!list.empty()) {
    for (const auto& word : list == "build" ? set.build : set.setup) std::printf("%s ", word.c_str());
    std::printf("\n");
    return 0;
  }
  if (budget_s >= 0) set.budget_s = budget_s;
  for (const auto& name : only) {
    if (std::none_of(set.runs.begin(), set.runs.end(), [&](const Run& r) { return r.name == name; })) {
      std::fprintf(stderr, "run_set: --only names %s, which %s does not have\n", name.c_str(), set_path.c_str());
      return 2;
    }
  }
  if (commit.empty()) {
    std::fprintf(stderr, "run_set: --commit is required to label the results\n");
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::ofstream jsonl(out + "/bench.jsonl", std::ios::app);
  std::ofstream err_log(out + "/bench.err", std::ios::app);
  int failed = 0;
  for (const Run& run : set.runs) {
    if (!only.empty() && std::find(only.begin(), only.end(), run.name) == only.end()) continue;
    if (set.budget_s > 0 && elapsed() >= set.budget_s) {
      std::printf("skipped (time): %s\n", run.name.c_str());
      continue;
    }
    std::vector<std::string> words;
    for (const auto& w : run.command) words.push_back(Substitute(w, bin, out));
    std::vector<std::string> lines;
    const int rc = Execute(words, run.env, run.timeout_s, out + "/bench.err", &lines);
    for (const auto& line : lines) {
      Json parsed = line.rfind('{', 0) == 0 ? Json::parse(line, nullptr, /*allow_exceptions=*/false) : Json();
      if (!parsed.is_object()) {
        err_log << run.name << ": " << line << "\n";
        continue;
      }
      Json labelled = {{"commit", commit}, {"date", UtcNow()}, {"hardware", hardware}, {"run", run.name}};
      labelled.update(parsed);
      jsonl << labelled.dump() << "\n";
    }
    jsonl.flush();
    err_log.flush();
    failed += rc != 0;
    std::printf("%s: rc %d after %.0f s\n", run.name.c_str(), rc, elapsed());
    std::fflush(stdout);
  }
  return failed > 0 ? 1 : 0;
}
