#include "engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace slide {

double LrSchedule::At(int64_t step) const {
  if (step < warmup_steps)
    return peak_lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  switch (kind) {
    case LrScheduleKind::kConstant:
      return peak_lr;
    case LrScheduleKind::kLinear:
      return peak_lr * std::max(0.0, static_cast<double>(total_steps - step) / decay_steps);
    case LrScheduleKind::kCosine: {
      const double progress = static_cast<double>(step - warmup_steps) / decay_steps;
      return peak_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
  }
  return peak_lr;
}

StatusOr<LrScheduleKind> ParseLrScheduleKind(const std::string& name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "linear") return LrScheduleKind::kLinear;
  if (name == "cosine") return LrScheduleKind::kCosine;
  return InvalidArgument("unknown learning-rate schedule '" + name + "' (expected constant, linear or cosine)");
}

const char* LrScheduleKindName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kLinear:
      return "linear";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  return "?";
}

}  // namespace slide
