// The optimizer state's NVMe tier: AdamW moments (and optionally the fp32 master weights) of every unit live in
// the unit's file on local disk instead of host memory. An update walks its unit in chunks through a small ring
// of block-aligned buffers: chunk reads are issued ahead in the order updates were scheduled (so the next unit's
// state is on its way while this one updates), the update runs on the buffer, and the chunk is written back
// behind. Host memory is the ring, whatever the model's size. No LibTorch here.
//
// A unit's file holds its arrays one after another, each padded to the block size:
//   [exp_avg: numel fp32][exp_avg_sq: numel fp32][master: numel fp32, moments_and_master only]
// so a chunk is one read per array, and a checkpoint reads or writes one array as one range.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/io/nvme_store.h"

namespace slide {

enum class TierMode { kNone, kMoments, kMomentsAndMaster };
StatusOr<TierMode> ParseTierMode(const std::string& name);  // none | moments | moments_and_master
const char* TierModeName(TierMode mode);

// The arrays of a unit's optimizer state, in file order.
enum StateArray { kExpAvg = 0, kExpAvgSq = 1, kMasterArray = 2 };

struct StateTierOptions {
  TierMode mode = TierMode::kNone;
  NvmeOptions io;                  // directories, backend, queue depth, request and block size, I/O threads
  size_t chunk_bytes = 32u << 20;  // bytes of one array in one chunk (a multiple of the block size)
  int buffers = 6;                 // chunks in the ring: read ahead, being updated, written behind
  // Whose state the tier holds: -1 every unit (embedding and head too); k >= 1 only the last k layers, the rest
  // staying in host memory, so a model a little too large for the host spills only what does not fit. The last
  // layers are the ones whose updates the next forward needs last (updates run in forward order). A job's 0 (as few
  // as fit) is the planner's to resolve before the tier opens (PlanRequest::nvme_layers).
  int64_t layers = -1;
};

// Host bytes of the ring `options` asks for.
int64_t StateTierRingBytes(const StateTierOptions& options);

// For each unit of a model with `num_layers` layers (embedding, layers..., head): its index among the units the
// tier holds (options.layers), or -1 where its state stays in host memory. Empty for mode none; a layer count
// outside -1 and 1..num_layers is INVALID_ARGUMENT.
StatusOr<std::vector<int64_t>> TierUnitIndex(int64_t num_layers, const StateTierOptions& options);

class StateTier {
 public:
  // Creates and preallocates one file per unit (RESOURCE_EXHAUSTED naming the directory when a disk cannot hold
  // them). Fresh files read as zeros: the moments start at zero; a tiered master must be written (WriteArray).
  static StatusOr<std::unique_ptr<StateTier>> Open(const StateTierOptions& options,
                                                   const std::vector<int64_t>& unit_numel);
  ~StateTier();  // waits for I/O in flight, removes the files
  StateTier(const StateTier&) = delete;
  StateTier& operator=(const StateTier&) = delete;

  size_t units() const { return numel_.size(); }  // the units it holds, indexed 0..units()-1
  // The arrays on disk: 2 (moments) or 3 (moments and master).
  int arrays() const { return arrays_; }
  bool holds_master() const { return arrays_ == 3; }

  // Any thread (the engine's): `unit`'s next update comes after every update scheduled before it. Reads of its
  // first chunks start now when ring buffers are free. Never blocks on I/O.
  void Schedule(size_t unit);

  struct Chunk {
    int64_t begin = 0;                              // first element of the unit this chunk covers
    int64_t n = 0;                                  // elements
    float* array[3] = {nullptr, nullptr, nullptr};  // indexed by StateArray; master is null unless tiered
  };
  // The update thread: for each chunk of `unit`, in order, waits for its read, runs `fn` on it, and issues its
  // write-back. Units must be updated in the order they were scheduled. The first I/O error is returned by this
  // and every later call (the state on disk is then not trustworthy; the job fails).
  Status Update(size_t unit, const std::function<void(const Chunk&)>& fn);

  // Every write-back has finished (before a checkpoint reads the files); the first I/O error if any.
  Status Flush();
  // Whole arrays through a bounce buffer, synchronously; only with no update pending (after Flush).
  Status ReadArray(size_t unit, StateArray array, float* dst);
  Status WriteArray(size_t unit, StateArray array, const float* src);

  // Nanoseconds Update has spent waiting on the disk (reads not yet in, write-backs holding every buffer).
  int64_t io_wait_ns() const { return io_wait_ns_.load(); }
  int64_t ring_bytes() const;       // host memory of the ring
  int64_t disk_bytes() const;       // bytes reserved on disk
  std::string description() const;  // mode, chunk, ring, and the store's backend
  const NvmeStore& store() const { return *store_; }

 private:
  enum class SlotState { kFree, kReading, kWriting, kDraining };  // draining: the update thread waits on it
  struct Slot {
    AlignedBuffer buf;  // arrays_ x chunk_elems_ floats
    SlotState state = SlotState::kFree;
    size_t unit = 0;
    int64_t chunk = 0;
    std::vector<std::future<Status>> io;
  };
  StateTier() = default;
  int64_t Chunks(size_t unit) const { return (numel_[unit] + chunk_elems_ - 1) / chunk_elems_; }
  uint64_t Offset(size_t unit, int array, int64_t chunk) const;
  size_t IoBytes(size_t unit, int64_t chunk) const;
  float* SlotArray(Slot& s, int array) const;
  Status CheckArray(size_t unit, StateArray array) const;  // the unit exists and this tier holds the array
  void IssueReadsLocked();                 // fills free (or finished) slots with the next scheduled chunks
  bool ReclaimLocked(Slot& s, bool wait);  // a writing slot whose writes are done becomes free
  Status WaitIo(Slot& s);

  StateTierOptions options_;
  int arrays_ = 2;
  int64_t chunk_elems_ = 0;
  std::vector<int64_t> numel_;
  std::vector<Slot> slots_;  // declared before store_: the store (and its I/O) goes first
  std::unique_ptr<NvmeStore> store_;

  std::mutex mu_;                // guards everything below and the slots' states
  std::deque<size_t> schedule_;  // units scheduled whose chunks are not all read yet, in update order
  int64_t next_chunk_ = 0;       // the next chunk of schedule_.front() to read
  std::deque<size_t> reading_;   // slots with reads issued, in schedule order
  Status error_;
  std::atomic<int64_t> io_wait_ns_{0};
};

}  // namespace slide
