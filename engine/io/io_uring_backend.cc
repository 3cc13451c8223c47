#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "engine/io/io_backend.h"

#if SLIDE_HAVE_IO_URING
#include <liburing.h>
#endif

namespace slide {

#if SLIDE_HAVE_IO_URING
namespace {

class IoUringBackend final : public IoBackend {
 public:
  ~IoUringBackend() override {
    if (ready_) io_uring_queue_exit(&ring_);  // on a ring never set up it would close fd 0
  }

  static StatusOr<std::unique_ptr<IoBackend>> Create(unsigned depth, const std::vector<iovec>& fixed) {
    auto b = std::unique_ptr<IoUringBackend>(new IoUringBackend());
    b->depth_ = depth;
    io_uring_params params{};  // no SINGLE_ISSUER: the store may build a ring on one thread and use it on another
    const int rc = io_uring_queue_init_params(depth, &b->ring_, &params);
    if (rc < 0) return Status(StatusCode::kUnavailable, std::string("io_uring_setup: ") + std::strerror(-rc));
    b->ready_ = true;
    if (!fixed.empty()) {
      // Registered memory counts against RLIMIT_MEMLOCK: without it the ring still works, one copy slower.
      const int reg = io_uring_register_buffers(&b->ring_, fixed.data(), static_cast<unsigned>(fixed.size()));
      if (reg == 0) {
        b->fixed_ = fixed;
      } else {
        b->register_error_ = std::strerror(-reg);
      }
    }
    return std::unique_ptr<IoBackend>(std::move(b));
  }

  std::string name() const override {
    if (!fixed_.empty()) return "io_uring (registered buffers)";
    return register_error_.empty() ? "io_uring" : "io_uring (buffers not registered: " + register_error_ + ")";
  }

  Status Run(const std::vector<IoRequest>& requests) override {
    std::vector<size_t> done(requests.size(), 0);
    std::deque<size_t> ready;  // requests with bytes left and nothing in flight
    for (size_t i = 0; i < requests.size(); ++i)
      if (requests[i].len > 0) ready.push_back(i);
    Status first = Status::Ok();
    unsigned in_flight = 0;
    while (!ready.empty() || in_flight > 0) {
      while (!ready.empty() && in_flight < depth_) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) break;
        const size_t i = ready.front();
        ready.pop_front();
        Prepare(sqe, requests[i], done[i]);
        io_uring_sqe_set_data64(sqe, i);
        ++in_flight;
      }
      const int rc = in_flight > 0 ? io_uring_submit_and_wait(&ring_, 1) : 0;
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // Submit nothing more, but never return while the kernel may still write into the callers' buffers.
        if (first.ok()) first = Internal(std::string("io_uring_enter: ") + std::strerror(-rc));
        ready.clear();
        io_uring_cqe* wait = nullptr;
        const int w = io_uring_wait_cqe(&ring_, &wait);
        if (w == -EINTR) continue;
        if (w < 0) break;  // the ring itself is broken: nothing more will complete
      }
      io_uring_cqe* cqe = nullptr;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
        const size_t i = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        --in_flight;
        const IoRequest& r = requests[i];
        if ((res == -EINTR || res == -EAGAIN) && first.ok()) {
          ready.push_back(i);
        } else if (res == -EINVAL && done[i] % 512 != 0) {
          // An O_DIRECT continuation after a short transfer is misaligned: the short transfer is the error.
          if (first.ok()) first = IoShortStatus(r, r.offset + done[i], r.len - done[i]);
        } else if (res < 0) {
          if (first.ok()) first = IoErrnoStatus(r, r.offset + done[i], -res);
        } else if (res == 0) {
          if (first.ok()) first = IoShortStatus(r, r.offset + done[i], r.len - done[i]);
        } else {
          done[i] += static_cast<size_t>(res);
          if (done[i] < r.len && first.ok()) ready.push_back(i);  // a short transfer continues where it stopped
        }
      }
    }
    return first;
  }

 private:
  IoUringBackend() = default;

  // The registered buffer holding [p, p+n), or -1.
  int FixedIndex(const void* p, size_t n) const {
    const auto* c = static_cast<const char*>(p);
    for (size_t k = 0; k < fixed_.size(); ++k) {
      const auto* base = static_cast<const char*>(fixed_[k].iov_base);
      if (c >= base && c + n <= base + fixed_[k].iov_len) return static_cast<int>(k);
    }
    return -1;
  }

  void Prepare(io_uring_sqe* sqe, const IoRequest& r, size_t done) {
    char* p = static_cast<char*>(r.buf) + done;
    const unsigned n =
        static_cast<unsigned>(std::min<size_t>(r.len - done, size_t{1} << 30));  // SQE lengths are 32-bit
    const uint64_t off = r.offset + done;
    const int fixed = FixedIndex(p, n);
    if (fixed >= 0) {
      if (r.write) {
        io_uring_prep_write_fixed(sqe, r.fd, p, n, off, fixed);
      } else {
        io_uring_prep_read_fixed(sqe, r.fd, p, n, off, fixed);
      }
    } else if (r.write) {
      io_uring_prep_write(sqe, r.fd, p, n, off);
    } else {
      io_uring_prep_read(sqe, r.fd, p, n, off);
    }
  }

  io_uring ring_{};
  bool ready_ = false;
  unsigned depth_ = 32;
  std::vector<iovec> fixed_;
  std::string register_error_;
};

}  // namespace

StatusOr<std::unique_ptr<IoBackend>> MakeIoUringBackend(unsigned queue_depth, const std::vector<iovec>& fixed) {
  return IoUringBackend::Create(queue_depth, fixed);
}
bool IoUringCompiledIn() { return true; }

#else

StatusOr<std::unique_ptr<IoBackend>> MakeIoUringBackend(unsigned, const std::vector<iovec>&) {
  return Status(StatusCode::kUnavailable, "built without liburing");
}
bool IoUringCompiledIn() { return false; }

#endif

}  // namespace slide
