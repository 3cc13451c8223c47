#include "engine/runtime/weights_first_policy.h"

namespace slide {

void WeightsFirstPolicy::Record(const Sample& s) {
  ++steps_;
  const bool clean = s.ran_updates && last_ran_.has_value() && *last_ran_ == s.ran_weights_first;
  last_ran_ = s.ran_updates ? std::optional<bool>(s.ran_weights_first) : std::nullopt;
  if (!clean || s.compute_s <= 0 || s.step_s <= 0) return;
  const int k = s.ran_weights_first ? 1 : 0;
  const double cost = s.step_s / s.compute_s;
  cost_[k] = cost_[k] ? options_.smoothing * cost + (1 - options_.smoothing) * *cost_[k] : cost;
  measured_at_[k] = steps_;
  if (!s.ran_weights_first) {
    whole_step_s_ = s.step_s;
    whole_cpu_update_s_ = s.cpu_update_s;
  }
}

bool WeightsFirstPolicy::MayWin() const { return whole_cpu_update_s_ * options_.both_passes_cost < whole_step_s_; }

bool WeightsFirstPolicy::Choose() {
  if (!cost_[0]) return false;     // the whole update's pace first
  if (!cost_[1]) return MayWin();  // then weights first, where it could win, until a step counts
  const bool best = *cost_[1] < *cost_[0];
  const bool other = !best;
  if (steps_ - measured_at_[other] >= options_.reprobe_steps && (other == false || MayWin())) return other;
  return best;
}

}  // namespace slide
