// WeightRing: a few page-locked buffers that carry the next forward's layer weights from the weights-only AdamW
// pass (UpdateWorker thread) to the device (engine thread), so each unit's gradient can stay in its staging
// buffer until the whole update reads it. A round hands out tickets 0, 1, ... (the ring layers of one forward,
// in order); ticket k uses buffer k % size, and its filler waits until the device copy of ticket k - size has
// read that buffer. Cancel (the engine, when no forward will read what is pending: a checkpoint, a restore, a
// failed step) waits for the copies issued so far and lets every pending and later fill of the round go on.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace slide {

class WeightRing {
 public:
  explicit WeightRing(std::vector<at::Tensor> buffers);  // flat, equal capacity, page-locked on CUDA
  int64_t size() const { return static_cast<int64_t>(buffers_.size()); }

  // A new round of `tickets` fills. Every fill of the previous round has finished (the caller waited for them).
  void Begin(int64_t tickets);
  // Filler: the buffer for `ticket`, once the copy of ticket - size has read it (or the round was cancelled).
  at::Tensor Acquire(int64_t ticket);
  // Engine: the buffer holding `ticket` (its fill has finished), and, after issuing the copy that reads it, a
  // function that returns once the copy has read it.
  at::Tensor Buffer(int64_t ticket) const { return buffers_[ticket % size()]; }
  void Consumed(int64_t ticket, std::function<void()> read_done);
  void Cancel();

 private:
  std::vector<at::Tensor> buffers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> read_done_;  // per ticket of the round; set once consumed
  bool cancelled_ = false;
};

}  // namespace slide
