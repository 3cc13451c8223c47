// The daemon's configuration: embedded defaults (kDefaultDaemonConfigYaml, so slided starts with no file),
// overlaid by an optional YAML file, overlaid by flags. Every error names the file, line and field path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/status.h"

namespace slide {

struct DaemonConfig {
  // server
  std::string listen;          // gRPC HOST:PORT (port 0 picks one)
  std::string metrics_listen;  // Prometheus /metrics HOST:PORT; empty disables it
  int64_t shutdown_deadline_seconds = 0;
  std::string log_level;  // debug | info | warning | error
  // storage
  std::string state_dir;  // empty: $XDG_DATA_HOME/slideformer, else ~/.local/share/slideformer
  // security
  std::string token;       // bearer token every slide.v1 call must carry when set
  std::string token_file;  // or read from this file (first line)
  std::string tls_cert_file, tls_key_file;
  std::vector<std::string> allowed_roots;  // job paths must resolve under one of these; empty: anywhere
  // jobs
  int64_t checkpoint_every = 0;      // default for jobs that leave it at 0
  int64_t max_interrupted_runs = 0;  // JobManagerOptions::max_interrupted_runs
  int64_t max_events_per_job = 0;
  int64_t gpu_budget_bytes = 0;  // default per-job GPU budget
  // The NVMe tier for jobs that set nvme_state: directories (one per disk), backend and I/O shape.
  std::vector<std::string> nvme_dirs;
  std::string nvme_backend;  // auto | io_uring | pread
  int64_t nvme_queue_depth = 0, nvme_io_threads = 0, nvme_request_bytes = 0, nvme_chunk_bytes = 0, nvme_buffers = 0;
};

extern const char kDefaultDaemonConfigYaml[];

// Defaults, then `path` when not empty. Unknown keys, wrong types and bad values are errors.
StatusOr<DaemonConfig> LoadDaemonConfig(const std::string& path);
// Cross-field checks after flags were applied: resolves state_dir, the default listen address (the owner-only
// socket unix:<state_dir>/slided.sock) and the token file.
Status FinalizeDaemonConfig(DaemonConfig* config);

// In the state directory (slidectl looks for them there too).
constexpr const char* kSocketName = "slided.sock";
constexpr const char* kGeneratedTokenName = "token";

bool ListensOnTcp(const DaemonConfig& config);
// A TCP listener always needs a token: when none is configured, one is generated into <state_dir>/token (owner-only,
// made once and reused). True when this call made it. Call once the state directory exists.
StatusOr<bool> EnsureTcpToken(DaemonConfig* config);

}  // namespace slide
