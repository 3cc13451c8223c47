#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/io/io_backend.h"

namespace slide {
namespace {

class PreadBackend final : public IoBackend {
 public:
  Status Run(const std::vector<IoRequest>& requests) override {
    Status first = Status::Ok();
    for (const auto& r : requests) {
      Status st = RunOne(r);
      if (!st.ok() && first.ok()) first = st;
    }
    return first;
  }
  std::string name() const override { return "pread/pwrite"; }

 private:
  static Status RunOne(const IoRequest& r) {
    size_t done = 0;
    while (done < r.len) {
      char* p = static_cast<char*>(r.buf) + done;
      const ssize_t n = r.write ? ::pwrite(r.fd, p, r.len - done, static_cast<off_t>(r.offset + done))
                                : ::pread(r.fd, p, r.len - done, static_cast<off_t>(r.offset + done));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      // An O_DIRECT continuation after a short transfer is misaligned (EINVAL): the short transfer is the error.
      if (n < 0 && errno == EINVAL && done % 512 != 0) return IoShortStatus(r, r.offset + done, r.len - done);
      if (n < 0) return IoErrnoStatus(r, r.offset + done, errno);
      if (n == 0) return IoShortStatus(r, r.offset + done, r.len - done);
      done += static_cast<size_t>(n);  // a short transfer continues where it stopped
    }
    return Status::Ok();
  }
};

std::string Where(const IoRequest& r, uint64_t offset) {
  return (r.path != nullptr ? *r.path : "fd " + std::to_string(r.fd)) + " at offset " + std::to_string(offset);
}

}  // namespace

Status IoErrnoStatus(const IoRequest& r, uint64_t offset, int err) {
  const std::string what =
      Where(r, offset) + ": " + (r.write ? "write" : "read") + " failed (" + std::strerror(err) + ")";
  if (err == ENOSPC || err == EFBIG || err == EDQUOT) return ResourceExhausted(what + ": the NVMe tier's disk is full");
  if (err == EIO) return DataLoss(what);
  return Internal(what);
}

Status IoShortStatus(const IoRequest& r, uint64_t offset, size_t left) {
  return DataLoss(Where(r, offset) + ": " + (r.write ? "write made no progress" : "read reached the end of the file") +
                  " with " + std::to_string(left) + " bytes left");
}

std::unique_ptr<IoBackend> MakePreadBackend() { return std::make_unique<PreadBackend>(); }

}  // namespace slide
