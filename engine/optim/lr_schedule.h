// Learning-rate schedules with the semantics of transformers.get_scheduler (warmup from 0, then
// constant / linear decay to 0 / half-cosine decay to 0), evaluated at 0-based optimizer steps.
#pragma once

#include <cstdint>
#include <string>

#include "engine/common/status.h"

namespace slide {

enum class LrScheduleKind { kConstant, kLinear, kCosine };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  double peak_lr = 1e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  // The rate used by optimizer step `step` (0-based).
  double At(int64_t step) const;
};

StatusOr<LrScheduleKind> ParseLrScheduleKind(const std::string& name);  // "constant" | "linear" | "cosine"
const char* LrScheduleKindName(LrScheduleKind kind);

}  // namespace slide
