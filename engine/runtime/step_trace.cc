#include "engine/runtime/step_trace.h"

#include <chrono>
#include <cstdio>
#include <map>

namespace slide {

double TraceNow() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string ToChromeTrace(const std::vector<TraceSpan>& spans, double origin) {
  std::map<std::string, int> lane_ids;
  for (const auto& s : spans) lane_ids.emplace(s.lane, static_cast<int>(lane_ids.size()));
  std::string out = "{\"traceEvents\": [\n";
  char buf[512];
  bool first = true;
  for (const auto& [lane, id] : lane_ids) {
    std::snprintf(buf, sizeof(buf),
                  "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
                  first ? "" : ",\n", id, lane.c_str());
    out += buf;
    first = false;
  }
  for (const auto& s : spans) {
    std::snprintf(buf, sizeof(buf),
                  ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f}",
                  s.name.c_str(), lane_ids[s.lane], (s.t0 - origin) * 1e6, (s.t1 - s.t0) * 1e6);
    out += buf;
  }
  out += "\n]}\n";
  return out;
}

}  // namespace slide
