#include "engine/runtime/weight_ring.h"

#include <c10/util/Exception.h>

#include <utility>

namespace slide {

WeightRing::WeightRing(std::vector<at::Tensor> buffers) : buffers_(std::move(buffers)) {
  TORCH_CHECK(!buffers_.empty(), "a weight ring needs at least one buffer");
}

void WeightRing::Begin(int64_t tickets) {
  std::lock_guard<std::mutex> lock(mu_);
  read_done_.assign(tickets, nullptr);
  cancelled_ = false;
}

at::Tensor WeightRing::Acquire(int64_t ticket) {
  std::function<void()> previous_read;
  {
    std::unique_lock<std::mutex> lock(mu_);
    TORCH_CHECK(ticket >= 0 && ticket < static_cast<int64_t>(read_done_.size()), "weight ring ticket ", ticket,
                " outside the round of ", read_done_.size());
    const int64_t before = ticket - size();
    if (before >= 0) {
      cv_.wait(lock, [&] { return cancelled_ || read_done_[before] != nullptr; });
      if (!cancelled_) previous_read = read_done_[before];
    }
  }
  if (previous_read) previous_read();  // the device copy has read the buffer (outside the lock: it may block)
  return Buffer(ticket);
}

void WeightRing::Consumed(int64_t ticket, std::function<void()> read_done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(ticket >= 0 && ticket < static_cast<int64_t>(read_done_.size()) && read_done_[ticket] == nullptr,
                "weight ring ticket ", ticket, " consumed twice or outside its round");
    read_done_[ticket] = read_done ? std::move(read_done) : [] {};
  }
  cv_.notify_all();
}

void WeightRing::Cancel() {
  std::vector<std::function<void()>> issued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& f : read_done_)
      if (f) issued.push_back(f);
  }
  for (const auto& f : issued) {  // fills may overwrite any buffer from now on
    try {
      f();
    } catch (...) {  // a failed device: no copy is left to protect, and the caller has the device's error
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

}  // namespace slide
