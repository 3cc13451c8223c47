#include "engine/io/state_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace slide {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StatusOr<TierMode> ParseTierMode(const std::string& name) {
  if (name == "none") return TierMode::kNone;
  if (name == "moments") return TierMode::kMoments;
  if (name == "moments_and_master") return TierMode::kMomentsAndMaster;
  return InvalidArgument("NVMe state must be none, moments or moments_and_master, got '" + name + "'");
}

const char* TierModeName(TierMode mode) {
  switch (mode) {
    case TierMode::kNone:
      return "none";
    case TierMode::kMoments:
      return "moments";
    case TierMode::kMomentsAndMaster:
      return "moments_and_master";
  }
  return "?";
}

int64_t StateTierRingBytes(const StateTierOptions& options) {
  if (options.mode == TierMode::kNone) return 0;
  const int arrays = options.mode == TierMode::kMomentsAndMaster ? 3 : 2;
  return static_cast<int64_t>(options.buffers) * static_cast<int64_t>(options.chunk_bytes) * arrays;
}

StatusOr<std::vector<int64_t>> TierUnitIndex(int64_t num_layers, const StateTierOptions& options) {
  std::vector<int64_t> index;
  if (options.mode == TierMode::kNone) return index;
  if (options.layers != -1 && (options.layers < 1 || options.layers > num_layers))
    return InvalidArgument("NVMe tier layers must be -1 (every unit) or between 1 and the layer count (" +
                           std::to_string(num_layers) + "), got " + std::to_string(options.layers));
  const int64_t units = num_layers + 2;
  // Every unit, or units [first, first + layers): the last layers, before the head.
  const int64_t first = options.layers < 0 ? 0 : 1 + num_layers - options.layers;
  const int64_t end = options.layers < 0 ? units : 1 + num_layers;
  index.assign(units, -1);
  for (int64_t u = first; u < end; ++u) index[u] = u - first;
  return index;
}

StatusOr<std::unique_ptr<StateTier>> StateTier::Open(const StateTierOptions& options,
                                                     const std::vector<int64_t>& unit_numel) {
  if (options.mode == TierMode::kNone) return InvalidArgument("the NVMe state tier was opened with mode none");
  const size_t block = options.io.block_bytes;
  if (block == 0 || options.chunk_bytes < block || options.chunk_bytes % block != 0)
    return InvalidArgument("NVMe chunk size " + std::to_string(options.chunk_bytes) +
                           " must be a positive multiple of the block size " + std::to_string(block));
  if (options.buffers < 2) return InvalidArgument("the NVMe tier needs at least 2 ring buffers");

  auto tier = std::unique_ptr<StateTier>(new StateTier());
  tier->options_ = options;
  tier->arrays_ = options.mode == TierMode::kMomentsAndMaster ? 3 : 2;
  tier->chunk_elems_ = static_cast<int64_t>(options.chunk_bytes / sizeof(float));
  tier->numel_ = unit_numel;
  std::vector<size_t> file_bytes;
  for (int64_t n : unit_numel) {
    const size_t region = (static_cast<size_t>(n) * sizeof(float) + block - 1) / block * block;
    file_bytes.push_back(region * tier->arrays_);
  }
  std::vector<iovec> registered;
  for (int i = 0; i < options.buffers; ++i) {
    Slot s;
    s.buf = AlignedBuffer(options.chunk_bytes * tier->arrays_, block);
    registered.push_back({s.buf.data(), s.buf.size()});
    tier->slots_.push_back(std::move(s));
  }
  SLIDE_ASSIGN_OR_RETURN(tier->store_, NvmeStore::Open(options.io, file_bytes, registered));
  return tier;
}

StateTier::~StateTier() {
  // The store's destructor drains its queues before the ring (declared earlier) is freed.
  store_.reset();
}

uint64_t StateTier::Offset(size_t unit, int array, int64_t chunk) const {
  const size_t block = options_.io.block_bytes;
  const uint64_t region = (static_cast<uint64_t>(numel_[unit]) * sizeof(float) + block - 1) / block * block;
  return array * region + static_cast<uint64_t>(chunk) * chunk_elems_ * sizeof(float);
}

// The last chunk's bytes round up to the block size; the array's region is padded to it, so they stay inside.
size_t StateTier::IoBytes(size_t unit, int64_t chunk) const {
  const size_t block = options_.io.block_bytes;
  const int64_t n = std::min(chunk_elems_, numel_[unit] - chunk * chunk_elems_);
  return (static_cast<size_t>(n) * sizeof(float) + block - 1) / block * block;
}

float* StateTier::SlotArray(Slot& s, int array) const {
  return static_cast<float*>(s.buf.data()) + static_cast<size_t>(array) * chunk_elems_;
}

Status StateTier::WaitIo(Slot& s) {
  Status first;
  for (auto& f : s.io) {
    Status st = f.get();
    if (first.ok() && !st.ok()) first = std::move(st);
  }
  s.io.clear();
  return first;
}

bool StateTier::ReclaimLocked(Slot& s, bool wait) {
  if (s.state != SlotState::kWriting) return s.state == SlotState::kFree;
  if (!wait)
    for (auto& f : s.io)
      if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
  Status st = WaitIo(s);
  if (error_.ok() && !st.ok()) error_ = std::move(st);
  s.state = SlotState::kFree;
  return true;
}

void StateTier::IssueReadsLocked() {
  while (!schedule_.empty() && error_.ok()) {
    const size_t unit = schedule_.front();
    if (next_chunk_ >= Chunks(unit)) {  // an empty unit, or every chunk issued
      schedule_.pop_front();
      next_chunk_ = 0;
      continue;
    }
    // The chunk's previous write-back must land before it is read again (the store may run them on different
    // I/O threads); when it has not, stop here rather than block the caller.
    bool blocked = false;
    for (Slot& s : slots_)
      if (s.unit == unit && s.chunk == next_chunk_ &&
          (s.state == SlotState::kDraining || (s.state == SlotState::kWriting && !ReclaimLocked(s, false))))
        blocked = true;
    if (blocked) return;
    Slot* free_slot = nullptr;
    for (Slot& s : slots_)
      if (ReclaimLocked(s, false)) {
        free_slot = &s;
        break;
      }
    if (free_slot == nullptr) return;
    Slot& s = *free_slot;
    s.state = SlotState::kReading;
    s.unit = unit;
    s.chunk = next_chunk_;
    const size_t bytes = IoBytes(unit, next_chunk_);
    for (int a = 0; a < arrays_; ++a)
      s.io.push_back(store_->ReadRange(unit, Offset(unit, a, next_chunk_), bytes, SlotArray(s, a)));
    reading_.push_back(static_cast<size_t>(&s - slots_.data()));
    ++next_chunk_;
  }
}

void StateTier::Schedule(size_t unit) {
  std::lock_guard<std::mutex> lock(mu_);
  schedule_.push_back(unit);
  IssueReadsLocked();
}

Status StateTier::Update(size_t unit, const std::function<void(const Chunk&)>& fn) {
  SLIDE_RETURN_IF_ERROR(CheckArray(unit, kExpAvg));
  for (int64_t c = 0; c < Chunks(unit); ++c) {
    Slot* slot = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (error_.ok()) {
        IssueReadsLocked();
        if (!reading_.empty()) break;
        // Nothing in flight: every slot is busy writing (or the chunk waits on its own write-back). Wait for the
        // oldest write and try again.
        Slot* writing = nullptr;
        for (Slot& s : slots_)
          if (s.state == SlotState::kWriting) {
            writing = &s;
            break;
          }
        if (writing == nullptr)
          return Internal("NVMe tier: unit " + std::to_string(unit) + " was updated without being scheduled");
        // Draining: no other thread touches its futures; the engine thread's Schedule is not held up meanwhile.
        writing->state = SlotState::kDraining;
        lock.unlock();
        const int64_t t0 = NowNs();
        Status drained = WaitIo(*writing);
        io_wait_ns_ += NowNs() - t0;
        lock.lock();
        if (error_.ok() && !drained.ok()) error_ = std::move(drained);
        writing->state = SlotState::kFree;
      }
      if (!error_.ok()) return error_;
      slot = &slots_[reading_.front()];
      if (slot->unit != unit || slot->chunk != c)
        return Internal("NVMe tier: unit " + std::to_string(unit) + " chunk " + std::to_string(c) +
                        " updated out of the scheduled order (unit " + std::to_string(slot->unit) + " chunk " +
                        std::to_string(slot->chunk) + " is next)");
      reading_.pop_front();
    }
    // The read futures belong to this slot alone now; wait for them without the lock.
    const int64_t t0 = NowNs();
    Status st = WaitIo(*slot);
    io_wait_ns_ += NowNs() - t0;
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.ok()) error_ = st;
      slot->state = SlotState::kFree;
      return st;
    }
    Chunk chunk;
    chunk.begin = c * chunk_elems_;
    chunk.n = std::min(chunk_elems_, numel_[unit] - chunk.begin);
    for (int a = 0; a < arrays_; ++a) chunk.array[a] = SlotArray(*slot, a);
    fn(chunk);
    std::lock_guard<std::mutex> lock(mu_);
    const size_t bytes = IoBytes(unit, c);
    for (int a = 0; a < arrays_; ++a)
      slot->io.push_back(store_->WriteRange(unit, Offset(unit, a, c), bytes, SlotArray(*slot, a)));
    slot->state = SlotState::kWriting;
    IssueReadsLocked();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Status StateTier::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Slot& s : slots_) ReclaimLocked(s, true);
  return error_;
}

Status StateTier::CheckArray(size_t unit, StateArray array) const {
  if (unit >= numel_.size()) return InvalidArgument("the NVMe tier has no unit " + std::to_string(unit));
  if (array >= arrays_) return InvalidArgument("the NVMe tier does not hold the master weights");
  return Status::Ok();
}

Status StateTier::ReadArray(size_t unit, StateArray array, float* dst) {
  SLIDE_RETURN_IF_ERROR(CheckArray(unit, array));
  SLIDE_RETURN_IF_ERROR(Flush());
  std::lock_guard<std::mutex> lock(mu_);
  if (!reading_.empty() || !schedule_.empty())
    return FailedPrecondition("NVMe tier: arrays are read only with no update pending");
  Slot& bounce = slots_.front();
  for (int64_t c = 0; c < Chunks(unit); ++c) {
    bounce.io.push_back(store_->ReadRange(unit, Offset(unit, array, c), IoBytes(unit, c), bounce.buf.data()));
    SLIDE_RETURN_IF_ERROR(WaitIo(bounce));
    const int64_t n = std::min(chunk_elems_, numel_[unit] - c * chunk_elems_);
    std::memcpy(dst + c * chunk_elems_, bounce.buf.data(), static_cast<size_t>(n) * sizeof(float));
  }
  return Status::Ok();
}

Status StateTier::WriteArray(size_t unit, StateArray array, const float* src) {
  SLIDE_RETURN_IF_ERROR(CheckArray(unit, array));
  SLIDE_RETURN_IF_ERROR(Flush());
  std::lock_guard<std::mutex> lock(mu_);
  if (!reading_.empty() || !schedule_.empty())
    return FailedPrecondition("NVMe tier: arrays are written only with no update pending");
  Slot& bounce = slots_.front();
  for (int64_t c = 0; c < Chunks(unit); ++c) {
    const int64_t n = std::min(chunk_elems_, numel_[unit] - c * chunk_elems_);
    const size_t bytes = IoBytes(unit, c);
    std::memcpy(bounce.buf.data(), src + c * chunk_elems_, static_cast<size_t>(n) * sizeof(float));
    std::memset(static_cast<char*>(bounce.buf.data()) + n * sizeof(float), 0, bytes - n * sizeof(float));
    bounce.io.push_back(store_->WriteRange(unit, Offset(unit, array, c), bytes, bounce.buf.data()));
    Status st = WaitIo(bounce);
    if (!st.ok()) {
      if (error_.ok()) error_ = st;
      return st;
    }
  }
  return Status::Ok();
}

int64_t StateTier::ring_bytes() const {
  int64_t total = 0;
  for (const Slot& s : slots_) total += static_cast<int64_t>(s.buf.size());
  return total;
}

int64_t StateTier::disk_bytes() const {
  int64_t total = 0;
  for (size_t u = 0; u < numel_.size(); ++u) total += static_cast<int64_t>(store_->PaddedBytes(u));
  return total;
}

std::string StateTier::description() const {
  return std::string(TierModeName(options_.mode)) + " of " +
         (options_.layers < 0 ? std::string("every unit") : "the last " + std::to_string(options_.layers) + " layers") +
         " on NVMe: " + std::to_string(disk_bytes() >> 20) + " MiB on disk, ring " + std::to_string(slots_.size()) +
         " x " + std::to_string(options_.chunk_bytes * arrays_ >> 20) + " MiB; " + store_->description();
}

}  // namespace slide
