#include "server/daemon_config.h"

#include <yaml-cpp/yaml.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/un.h>

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "engine/common/default_state_dir.h"
#include "engine/common/files.h"
#include "server/log.h"

namespace slide {

const char kDefaultDaemonConfigYaml[] = R"(# slided defaults (slided --print-default-config)
server:
  listen: ""               # empty: unix:<state_dir>/slided.sock, owner-only; HOST:PORT for TCP (needs a token)
  metrics_listen: 127.0.0.1:9464
  shutdown_deadline_seconds: 30
  log_level: info          # debug | info | warning | error (debug adds every job's own log lines)
storage:
  state_dir: ""            # empty: $XDG_DATA_HOME/slideformer or ~/.local/share/slideformer
security:
  token: ""                # for TCP (or token_file, or SLIDE_TOKEN); none given: generated into <state_dir>/token
  token_file: ""
  tls_cert_file: ""        # both set: gRPC over TLS
  tls_key_file: ""
  allowed_roots: []        # job model/dataset/output paths must lie under one of these; [] = anywhere
jobs:
  checkpoint_every: 100    # optimizer steps between checkpoints when a job does not say
  max_interrupted_runs: 3  # a job the daemon died under more often in a row (no new checkpoint) fails, not resumes
  max_events_per_job: 4096
  gpu_budget_bytes: 25769803776   # 24 GiB
nvme:                      # the optimizer state's disk tier, for jobs that set nvme_state
  dirs: []                 # one directory per local disk; [] = jobs cannot use the tier
  backend: auto            # auto (io_uring, else pread/pwrite) | io_uring | pread
  queue_depth: 32          # requests in flight per I/O thread
  io_threads: 2
  request_bytes: 1048576   # one I/O request (a multiple of 4096)
  chunk_bytes: 33554432    # one array of one chunk in the ring (a multiple of 4096)
  buffers: 6               # chunks in the ring: read ahead, updating, written behind
)";

namespace {

std::string Where(const std::string& file, const YAML::Node& n, const std::string& field) {
  return file + ":" + std::to_string(n.Mark().line + 1) + ":" + std::to_string(n.Mark().column + 1) + ": " + field;
}

using Setter = std::function<void(DaemonConfig*, const YAML::Node&)>;

Setter Str(std::string DaemonConfig::*m) {
  return [m](DaemonConfig* c, const YAML::Node& n) { c->*m = n.as<std::string>(); };
}
Setter Int(int64_t DaemonConfig::*m) {
  return [m](DaemonConfig* c, const YAML::Node& n) { c->*m = n.as<int64_t>(); };
}

const std::map<std::string, std::map<std::string, Setter>>& Schema() {
  static const auto* schema = new std::map<std::string, std::map<std::string, Setter>>{
      {"server",
       {{"listen", Str(&DaemonConfig::listen)},
        {"metrics_listen", Str(&DaemonConfig::metrics_listen)},
        {"shutdown_deadline_seconds", Int(&DaemonConfig::shutdown_deadline_seconds)},
        {"log_level", Str(&DaemonConfig::log_level)}}},
      {"storage", {{"state_dir", Str(&DaemonConfig::state_dir)}}},
      {"security",
       {{"token", Str(&DaemonConfig::token)},
        {"token_file", Str(&DaemonConfig::token_file)},
        {"tls_cert_file", Str(&DaemonConfig::tls_cert_file)},
        {"tls_key_file", Str(&DaemonConfig::tls_key_file)},
        {"allowed_roots",
         [](DaemonConfig* c, const YAML::Node& n) {
           if (!n.IsSequence()) throw YAML::BadConversion(n.Mark());
           c->allowed_roots.clear();
           for (const auto& r : n) c->allowed_roots.push_back(r.as<std::string>());
         }}}},
      {"jobs",
       {{"checkpoint_every", Int(&DaemonConfig::checkpoint_every)},
        {"max_interrupted_runs", Int(&DaemonConfig::max_interrupted_runs)},
        {"max_events_per_job", Int(&DaemonConfig::max_events_per_job)},
        {"gpu_budget_bytes", Int(&DaemonConfig::gpu_budget_bytes)}}},
      {"nvme",
       {{"dirs",
         [](DaemonConfig* c, const YAML::Node& n) {
           if (!n.IsSequence()) throw YAML::BadConversion(n.Mark());
           c->nvme_dirs.clear();
           for (const auto& r : n) c->nvme_dirs.push_back(r.as<std::string>());
         }},
        {"backend", Str(&DaemonConfig::nvme_backend)},
        {"queue_depth", Int(&DaemonConfig::nvme_queue_depth)},
        {"io_threads", Int(&DaemonConfig::nvme_io_threads)},
        {"request_bytes", Int(&DaemonConfig::nvme_request_bytes)},
        {"chunk_bytes", Int(&DaemonConfig::nvme_chunk_bytes)},
        {"buffers", Int(&DaemonConfig::nvme_buffers)}}},
  };
  return *schema;
}

Status Apply(const std::string& file, const YAML::Node& root, DaemonConfig* c) {
  if (root.IsNull()) return Status::Ok();  // an empty file
  if (!root.IsMap()) return InvalidArgument(Where(file, root, "") + "the config must be a mapping of sections");
  std::set<std::string> sections_seen;
  for (auto sec = root.begin(); sec != root.end(); ++sec) {
    if (!sec->first.IsScalar()) return InvalidArgument(Where(file, sec->first, "") + "a section name must be text");
    const std::string section = sec->first.Scalar();
    if (!sections_seen.insert(section).second)
      return InvalidArgument(Where(file, sec->first, section) + ": duplicate section");
    auto s = Schema().find(section);
    if (s == Schema().end())
      return InvalidArgument(Where(file, sec->first, section) +
                             ": unknown section (expected server, storage, security, jobs or nvme)");
    if (sec->second.IsNull()) continue;
    if (!sec->second.IsMap()) return InvalidArgument(Where(file, sec->second, section) + ": must be a mapping");
    std::set<std::string> keys_seen;
    for (auto kv = sec->second.begin(); kv != sec->second.end(); ++kv) {
      if (!kv->first.IsScalar()) return InvalidArgument(Where(file, kv->first, section) + ": a key must be text");
      const std::string key = kv->first.Scalar(), path = section + "." + key;
      if (!keys_seen.insert(key).second) return InvalidArgument(Where(file, kv->first, path) + ": duplicate key");
      auto f = s->second.find(key);
      if (f == s->second.end()) return InvalidArgument(Where(file, kv->first, path) + ": unknown key");
      try {
        f->second(c, kv->second);
      } catch (const YAML::Exception&) {
        return InvalidArgument(Where(file, kv->second, path) + ": wrong type");
      }
    }
  }
  return Status::Ok();
}

Status Check(bool ok, const std::string& field, const std::string& what) {
  return ok ? Status::Ok() : InvalidArgument("config field '" + field + "' " + what);
}

// The host of HOST:PORT or [IPV6]:PORT (brackets removed).
std::string ListenHost(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

// HOST:PORT (or [IPV6]:PORT, or unix:PATH): the port present and in 0..65535 (0 picks a free one), the host
// resolvable. gRPC would otherwise wrap a port past 65535 and take 443 for a missing one.
Status CheckListenAddress(const std::string& field, const std::string& address) {
  const std::string where = "config field '" + field + "' ('" + address + "')";
  if (address.rfind("unix:", 0) == 0) {
    const std::string path = address.substr(5);
    if (path.empty() || path[0] != '/') return InvalidArgument(where + ": a unix socket needs an absolute path");
    if (path.size() >= sizeof(sockaddr_un{}.sun_path))
      return InvalidArgument(where + ": the socket path is " + std::to_string(path.size()) + " bytes; at most " +
                             std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " fit");
    return Status::Ok();
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size())
    return InvalidArgument(where + " needs HOST:PORT, e.g. 127.0.0.1:50151");
  const std::string port = address.substr(colon + 1), host = ListenHost(address);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stol(port) > 65535)
    return InvalidArgument(where + ": port '" + port + "' is not a number in 0..65535");
  if (host.empty()) return InvalidArgument(where + ": the host is empty");
  if (host == "*") return Status::Ok();  // every interface
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  if (rc != 0) return InvalidArgument(where + ": cannot resolve host '" + host + "' (" + ::gai_strerror(rc) + ")");
  return Status::Ok();
}

// The embedded defaults, parsed once: every LoadDaemonConfig starts from a copy.
const StatusOr<DaemonConfig>& ParsedDefaults() {
  static const auto* defaults = new StatusOr<DaemonConfig>([]() -> StatusOr<DaemonConfig> {
    DaemonConfig c;
    SLIDE_RETURN_IF_ERROR(Apply("<defaults>", YAML::Load(kDefaultDaemonConfigYaml), &c));
    return c;
  }());
  return *defaults;
}

}  // namespace

StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path) {
  SLIDE_ASSIGN_OR_RETURN(DaemonConfig c, ParsedDefaults());
  if (!path.empty()) {
    SLIDE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return InvalidArgument(path + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                             ": " + e.msg);
    }
    SLIDE_RETURN_IF_ERROR(Apply(path, root, &c));
  }
  SLIDE_RETURN_IF_ERROR(Check(c.shutdown_deadline_seconds >= 1, "server.shutdown_deadline_seconds", "must be >= 1"));
  SLIDE_RETURN_IF_ERROR(Check(c.checkpoint_every >= 1, "jobs.checkpoint_every", "must be >= 1"));
  SLIDE_RETURN_IF_ERROR(Check(c.max_interrupted_runs >= 1 && c.max_interrupted_runs <= 1000,
                              "jobs.max_interrupted_runs", "must be in [1, 1000]"));
  SLIDE_RETURN_IF_ERROR(Check(c.max_events_per_job >= 16, "jobs.max_events_per_job", "must be >= 16"));
  SLIDE_RETURN_IF_ERROR(Check(c.gpu_budget_bytes > 0, "jobs.gpu_budget_bytes", "must be > 0"));
  for (size_t i = 0; i < c.allowed_roots.size(); ++i)
    SLIDE_RETURN_IF_ERROR(Check(!c.allowed_roots[i].empty() && c.allowed_roots[i][0] == '/',
                                "security.allowed_roots[" + std::to_string(i) + "]", "must be an absolute path"));
  for (size_t i = 0; i < c.nvme_dirs.size(); ++i)
    SLIDE_RETURN_IF_ERROR(Check(!c.nvme_dirs[i].empty() && c.nvme_dirs[i][0] == '/',
                                "nvme.dirs[" + std::to_string(i) + "]", "must be an absolute path"));
  SLIDE_RETURN_IF_ERROR(Check(c.nvme_backend == "auto" || c.nvme_backend == "io_uring" || c.nvme_backend == "pread",
                              "nvme.backend", "must be auto, io_uring or pread, got '" + c.nvme_backend + "'"));
  SLIDE_RETURN_IF_ERROR(
      Check(c.nvme_queue_depth >= 1 && c.nvme_queue_depth <= 4096, "nvme.queue_depth", "must be in [1, 4096]"));
  SLIDE_RETURN_IF_ERROR(
      Check(c.nvme_io_threads >= 1 && c.nvme_io_threads <= 64, "nvme.io_threads", "must be in [1, 64]"));
  SLIDE_RETURN_IF_ERROR(Check(c.nvme_request_bytes >= 4096 && c.nvme_request_bytes % 4096 == 0, "nvme.request_bytes",
                              "must be a positive multiple of 4096"));
  SLIDE_RETURN_IF_ERROR(Check(c.nvme_chunk_bytes >= 4096 && c.nvme_chunk_bytes % 4096 == 0, "nvme.chunk_bytes",
                              "must be a positive multiple of 4096"));
  SLIDE_RETURN_IF_ERROR(Check(c.nvme_buffers >= 2 && c.nvme_buffers <= 1024, "nvme.buffers", "must be in [2, 1024]"));
  return c;
}

Status FinalizeDaemonConfig(DaemonConfig* c) {
  // Here, after the flags: --log-level overrides server.log_level.
  SLIDE_RETURN_IF_ERROR(Check(ParseLogLevel(c->log_level).has_value(), "server.log_level",
                              "must be debug, info, warning or error, not '" + c->log_level + "'"));
  if (c->state_dir.empty()) {
    auto dir = DefaultStateDir();
    if (!dir.ok()) return dir.status().WithContext("config field 'storage.state_dir' is empty and");
    c->state_dir = dir.value();
  }
  if (c->state_dir[0] != '/') {  // the socket's address and the records' paths must not depend on the cwd
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr)
      return InvalidArgument("config field 'storage.state_dir' ('" + c->state_dir +
                             "') is relative and the "
                             "working directory cannot be read");
    c->state_dir = std::string(cwd) + "/" + c->state_dir;
  }
  if (c->listen.empty()) c->listen = "unix:" + c->state_dir + "/" + kSocketName;
  SLIDE_RETURN_IF_ERROR(CheckListenAddress("server.listen", c->listen));
  if (!c->metrics_listen.empty()) SLIDE_RETURN_IF_ERROR(CheckListenAddress("server.metrics_listen", c->metrics_listen));
  if (c->token.empty() && !c->token_file.empty()) {
    auto t = ReadFileToString(c->token_file);
    if (!t.ok()) return InvalidArgument("config field 'security.token_file': " + t.status().message());
    c->token = t.value().substr(0, t.value().find('\n'));
    while (!c->token.empty() && std::isspace(static_cast<unsigned char>(c->token.back()))) c->token.pop_back();
    // An empty file must not turn authentication off.
    if (c->token.empty())
      return InvalidArgument("config field 'security.token_file': '" + c->token_file +
                             "' holds no token on its first line");
  }
  if (c->token.empty()) {
    if (const char* env = std::getenv("SLIDE_TOKEN")) c->token = env;
  }
  if (c->tls_cert_file.empty() != c->tls_key_file.empty())
    return InvalidArgument("config fields 'security.tls_cert_file' and 'security.tls_key_file' must be set together");
  return Status::Ok();
}

bool ListensOnTcp(const DaemonConfig& c) { return c.listen.rfind("unix:", 0) != 0; }

StatusOr<bool> EnsureTcpToken(DaemonConfig* c) {
  if (!ListensOnTcp(*c) || !c->token.empty()) return false;
  const std::string path = c->state_dir + "/" + kGeneratedTokenName;
  // Made once, owner-only, then reused: slidectl run by the same user reads it (SLIDE_TOKEN for anyone else).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd >= 0) {
    unsigned char raw[32];
    if (::getrandom(raw, sizeof(raw), 0) != static_cast<ssize_t>(sizeof(raw))) {
      ::close(fd);
      ::unlink(path.c_str());
      return Internal("cannot draw random bytes for the token");
    }
    static const char kHex[] = "0123456789abcdef";
    std::string token;
    for (unsigned char b : raw) token += {kHex[b >> 4], kHex[b & 15]};
    const std::string line = token + "\n";
    const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
    ::close(fd);
    if (!written) {
      ::unlink(path.c_str());
      return FailedPrecondition("cannot write the generated token to '" + path + "'");
    }
    c->token = token;
    return true;
  }
  if (errno != EEXIST) return FailedPrecondition("cannot create '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
    return FailedPrecondition("'" + path + "' must be a regular file owned by this user and readable by it alone");
  SLIDE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  c->token = text.substr(0, text.find('\n'));
  if (c->token.size() < 32) return FailedPrecondition("'" + path + "' holds no usable token: remove it to make one");
  return false;
}

}  // namespace slide
