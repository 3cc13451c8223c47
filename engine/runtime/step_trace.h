// The timeline of one training step, for finding where the device sat idle: spans on the host's steady clock
// (seconds) in lanes "gpu.compute", "gpu.h2d", "gpu.d2h" (CUDA events aligned to the host clock), "update"
// (one span per unit's optimizer task) and "engine.wait" (the engine thread blocked on an update).
#pragma once

#include <string>
#include <vector>

namespace slide {

struct TraceSpan {
  std::string lane, name;
  double t0 = 0, t1 = 0;
};

// Seconds since the steady clock's epoch, the clock every span uses.
double TraceNow();

// Chrome trace-event JSON (load it in Perfetto or chrome://tracing), times relative to `origin`.
std::string ToChromeTrace(const std::vector<TraceSpan>& spans, double origin);

}  // namespace slide
