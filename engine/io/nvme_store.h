// The NVMe tier's storage: one file per unit (e.g. one layer's AdamW moments) spread round-robin over one or
// more directories (disks), opened with O_DIRECT where the file system allows it and preallocated, so a disk
// that cannot hold the tier is found when the store opens rather than mid-training. Reads and writes are
// asynchronous: unit u's I/O goes to I/O thread u % io_threads, each with its own queue and its own backend
// (its own io_uring ring, or pread/pwrite where io_uring is unavailable), in request_bytes chunks with
// queue_depth in flight. Buffers, offsets and lengths are block-aligned (AlignedBuffer). No LibTorch here.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/common/status.h"
#include "engine/io/io_backend.h"

namespace slide {

struct NvmeOptions {
  std::vector<std::string> dirs;  // one or more directories, ideally on different disks
  std::string backend = "auto";   // auto (io_uring, else pread/pwrite) | io_uring | pread
  unsigned queue_depth = 32;      // requests in flight per I/O thread
  size_t request_bytes = 1 << 20;
  size_t block_bytes = 4096;  // O_DIRECT alignment
  int io_threads = 2;
  bool direct = true;  // O_DIRECT; buffered where the file system refuses it (tmpfs), and said so
};

// Heap memory aligned to `alignment`, `bytes` rounded up to it, zero-filled. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(size_t bytes, size_t alignment);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Removes the files a store leaves behind when its process dies without closing it (kill -9, a crash): regular
// files named slide-unit-*.bin in `dir`. Returns how many were removed. A live store in another process keeps its
// open files working (they are only unlinked), so a daemon may run this at start.
int RemoveStaleStoreFiles(const std::string& dir);

class NvmeStore {
 public:
  // `register_buffers` are registered with each io_uring ring for fixed-buffer I/O (optional).
  static StatusOr<std::unique_ptr<NvmeStore>> Open(const NvmeOptions& options, const std::vector<size_t>& unit_bytes,
                                                   const std::vector<iovec>& register_buffers = {});
  ~NvmeStore();  // waits for queued I/O, closes and removes the files
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // The bytes a unit's buffer must hold: its size rounded up to the block size.
  size_t PaddedBytes(size_t unit) const { return padded_.at(unit); }
  // Writes / reads PaddedBytes(unit) bytes of a block-aligned buffer that stays valid until the future is ready.
  std::future<Status> Write(size_t unit, const void* src);
  std::future<Status> Read(size_t unit, void* dst);
  // The same for `bytes` at `offset` inside the unit's file: both block-aligned, within PaddedBytes(unit).
  std::future<Status> WriteRange(size_t unit, uint64_t offset, size_t bytes, const void* src);
  std::future<Status> ReadRange(size_t unit, uint64_t offset, size_t bytes, void* dst);

  std::string description() const;  // backend, O_DIRECT or buffered, and the reason for any fallback
  const std::string& backend_name() const { return backend_name_; }
  int64_t bytes_read() const { return bytes_read_.load(); }
  int64_t bytes_written() const { return bytes_written_.load(); }

 private:
  struct Task {
    size_t unit;
    bool write;
    void* buf;
    uint64_t offset;
    size_t bytes;
    std::promise<Status> done;
  };
  struct Worker {
    std::unique_ptr<IoBackend> backend;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> queue;
    bool stop = false;
    std::thread thread;
  };
  NvmeStore() = default;
  std::future<Status> Post(size_t unit, bool write, void* buf, uint64_t offset, size_t bytes);
  void Loop(Worker& w);

  NvmeOptions options_;
  std::vector<size_t> padded_;
  std::vector<int> fds_;
  std::vector<std::string> paths_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::string backend_name_, notes_;
  std::atomic<int64_t> bytes_read_{0}, bytes_written_{0};
};

}  // namespace slide
