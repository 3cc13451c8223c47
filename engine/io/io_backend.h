// Block I/O backends of the NVMe tier: io_uring (liburing) with a queue of requests in flight, and plain
// pread/pwrite as the fallback where io_uring is unavailable (EPERM under a container's seccomp profile, ENOSYS
// on old kernels, ENOMEM under a low memlock limit). Both continue short transfers, retry EINTR/EAGAIN, and
// turn any other failure into a Status that names the file, the offset and the errno. No LibTorch here.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/status.h"

namespace slide {

struct IoRequest {
  int fd = -1;
  bool write = false;
  uint64_t offset = 0;
  void* buf = nullptr;  // O_DIRECT files need buf, offset and len aligned to the block size
  size_t len = 0;
  const std::string* path = nullptr;  // for errors
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  // Runs every request to completion, blocking; the first failure (the others still finish or fail).
  virtual Status Run(const std::vector<IoRequest>& requests) = 0;
  virtual std::string name() const = 0;  // "io_uring", "io_uring (registered buffers)", "pread/pwrite"
};

// io_uring with `queue_depth` requests in flight. `fixed` buffers are registered with the ring (fixed-buffer
// reads and writes for requests inside them); a ring that cannot register them runs without. Fails when no ring
// can be set up (the caller falls back), with the reason.
StatusOr<std::unique_ptr<IoBackend>> MakeIoUringBackend(unsigned queue_depth, const std::vector<iovec>& fixed);
std::unique_ptr<IoBackend> MakePreadBackend();
bool IoUringCompiledIn();

// The status for errno `err` from request `r` at `offset`: disk full (ENOSPC, EFBIG, EDQUOT) is
// RESOURCE_EXHAUSTED, EIO is DATA_LOSS, the rest INTERNAL; the message names the file, offset and error.
Status IoErrnoStatus(const IoRequest& r, uint64_t offset, int err);
// A transfer that stopped with bytes left (end of file on a read, no progress on a write).
Status IoShortStatus(const IoRequest& r, uint64_t offset, size_t left);

}  // namespace slide
