#include "engine/io/nvme_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/common/thread_name.h"

namespace slide {

AlignedBuffer::AlignedBuffer(size_t bytes, size_t alignment) {
  size_ = (bytes + alignment - 1) / alignment * alignment;
  if (size_ == 0) return;
  if (::posix_memalign(&data_, alignment, size_) != 0) throw std::bad_alloc();
  std::memset(data_, 0, size_);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

int RemoveStaleStoreFiles(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("slide-unit-", 0) != 0 || name.size() < 15 || name.compare(name.size() - 4, 4, ".bin") != 0)
      continue;
    struct stat st {};
    const std::string path = dir + "/" + name;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Open(const NvmeOptions& options, const std::vector<size_t>& unit_bytes,
                                                     const std::vector<iovec>& register_buffers) {
  if (options.dirs.empty()) return InvalidArgument("the NVMe tier needs at least one directory");
  if (options.block_bytes == 0 || (options.block_bytes & (options.block_bytes - 1)) != 0)
    return InvalidArgument("NVMe block size must be a power of two, got " + std::to_string(options.block_bytes));
  if (options.request_bytes == 0 || options.request_bytes % options.block_bytes != 0)
    return InvalidArgument("NVMe request size must be a multiple of the block size");
  if (options.io_threads < 1 || options.queue_depth < 1)
    return InvalidArgument("NVMe io_threads and queue_depth must be >= 1");
  if (options.backend != "auto" && options.backend != "io_uring" && options.backend != "pread")
    return InvalidArgument("NVMe backend must be auto, io_uring or pread, got '" + options.backend + "'");

  auto store = std::unique_ptr<NvmeStore>(new NvmeStore());
  store->options_ = options;
  bool buffered_noted = false;
  for (size_t u = 0; u < unit_bytes.size(); ++u) {
    const size_t padded = (unit_bytes[u] + options.block_bytes - 1) / options.block_bytes * options.block_bytes;
    store->padded_.push_back(padded);
    const std::string& dir = options.dirs[u % options.dirs.size()];
    // A fresh, exclusively created name (O_EXCL never follows a planted link; two daemons sharing a directory,
    // both PID 1 in their containers, never meet).
    char name[64];
    std::snprintf(name, sizeof(name), "/slide-unit-%05zu-XXXXXX.bin", u);
    std::string path = dir + name;
    int fd = options.direct ? ::mkostemps(path.data(), 4, O_CLOEXEC | O_DIRECT) : -1;
    if (fd < 0 && options.direct && errno == EINVAL) {
      if (!buffered_noted) store->notes_ += "; buffered I/O: " + dir + " refuses O_DIRECT";
      buffered_noted = true;
    }
    if (fd < 0) {
      path = dir + name;
      fd = ::mkostemps(path.data(), 4, O_CLOEXEC);
    }
    if (fd < 0) return Status(StatusCode::kFailedPrecondition, path + ": cannot create (" + std::strerror(errno) + ")");
    store->fds_.push_back(fd);
    store->paths_.push_back(path);
    // Reserve the space now: a full disk fails the job when it starts, naming the directory.
    int rc = padded == 0 ? 0 : ::posix_fallocate(fd, 0, static_cast<off_t>(padded));
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd, static_cast<off_t>(padded)) == 0 ? 0 : errno;
    if (rc != 0)
      return Status(
          rc == ENOSPC || rc == EFBIG || rc == EDQUOT ? StatusCode::kResourceExhausted : StatusCode::kInternal,
          dir + ": cannot reserve " + std::to_string(padded) + " bytes for unit " + std::to_string(u) +
              " of the NVMe tier (" + std::strerror(rc) + ")");
  }

  std::string fallback_reason;
  for (int t = 0; t < options.io_threads; ++t) {
    auto w = std::make_unique<Worker>();
    if (options.backend != "pread" && fallback_reason.empty()) {
      auto ring = MakeIoUringBackend(options.queue_depth, register_buffers);
      if (ring.ok()) {
        w->backend = std::move(ring).value();
      } else if (options.backend == "io_uring") {
        return ring.status().WithContext("NVMe backend io_uring");
      } else {
        fallback_reason = ring.status().message();
      }
    }
    if (!w->backend) w->backend = MakePreadBackend();
    store->workers_.push_back(std::move(w));
  }
  store->backend_name_ = store->workers_.front()->backend->name();
  if (!fallback_reason.empty()) store->notes_ += "; io_uring unavailable (" + fallback_reason + ")";
  for (auto& w : store->workers_) {
    Worker* raw = w.get();
    w->thread = std::thread([s = store.get(), raw] { s->Loop(*raw); });
  }
  return store;
}

NvmeStore::~NvmeStore() {
  for (auto& w : workers_) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->stop = true;
    }
    w->cv.notify_all();
  }
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
  for (size_t i = 0; i < fds_.size(); ++i) {
    ::close(fds_[i]);
    ::unlink(paths_[i].c_str());
  }
}

std::string NvmeStore::description() const {
  return backend_name_ + ", " + std::to_string(workers_.size()) + " I/O threads x depth " +
         std::to_string(options_.queue_depth) + notes_;
}

std::future<Status> NvmeStore::Write(size_t unit, const void* src) {
  return Post(unit, true, const_cast<void*>(src), 0, unit < padded_.size() ? padded_[unit] : 0);
}

std::future<Status> NvmeStore::Read(size_t unit, void* dst) {
  return Post(unit, false, dst, 0, unit < padded_.size() ? padded_[unit] : 0);
}

std::future<Status> NvmeStore::WriteRange(size_t unit, uint64_t offset, size_t bytes, const void* src) {
  return Post(unit, true, const_cast<void*>(src), offset, bytes);
}

std::future<Status> NvmeStore::ReadRange(size_t unit, uint64_t offset, size_t bytes, void* dst) {
  return Post(unit, false, dst, offset, bytes);
}

std::future<Status> NvmeStore::Post(size_t unit, bool write, void* buf, uint64_t offset, size_t bytes) {
  std::promise<Status> p;
  std::future<Status> f = p.get_future();
  if (unit >= padded_.size()) {
    p.set_value(InvalidArgument("NVMe tier has no unit " + std::to_string(unit)));
    return f;
  }
  if (offset % options_.block_bytes != 0 || bytes % options_.block_bytes != 0 || offset + bytes > padded_[unit]) {
    p.set_value(InvalidArgument("NVMe tier range [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                                ") of unit " + std::to_string(unit) + " is not block-aligned inside its " +
                                std::to_string(padded_[unit]) + " bytes"));
    return f;
  }
  if (reinterpret_cast<uintptr_t>(buf) % options_.block_bytes != 0) {
    p.set_value(InvalidArgument("NVMe tier buffer for unit " + std::to_string(unit) + " is not " +
                                std::to_string(options_.block_bytes) + "-byte aligned"));
    return f;
  }
  Worker& w = *workers_[unit % workers_.size()];
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.queue.push_back(Task{unit, write, buf, offset, bytes, std::move(p)});
  }
  w.cv.notify_one();
  return f;
}

void NvmeStore::Loop(Worker& w) {
  NameThisThread("slide-nvme-io");
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(w.mu);
      w.cv.wait(lock, [&] { return w.stop || !w.queue.empty(); });
      if (w.queue.empty()) return;  // stopped and drained
      task = std::move(w.queue.front());
      w.queue.pop_front();
    }
    const size_t bytes = task.bytes;
    std::vector<IoRequest> requests;
    for (size_t off = 0; off < bytes; off += options_.request_bytes) {
      IoRequest r;
      r.fd = fds_[task.unit];
      r.write = task.write;
      r.offset = task.offset + off;
      r.buf = static_cast<char*>(task.buf) + off;
      r.len = std::min(options_.request_bytes, bytes - off);
      r.path = &paths_[task.unit];
      requests.push_back(r);
    }
    Status st = w.backend->Run(requests);
    if (st.ok()) (task.write ? bytes_written_ : bytes_read_) += static_cast<int64_t>(bytes);
    task.done.set_value(std::move(st));
  }
}

}  // namespace slide
