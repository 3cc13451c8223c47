#include "server/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace slide {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

}  // namespace

std::optional<LogLevel> ParseLogLevel(std::string_view name) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError})
    if (name == LogLevelName(l)) return l;
  return std::nullopt;
}

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void Log(LogLevel level, const std::string& message) {
  if (!LogEnabled(level)) return;
  static constexpr const char* kTags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const int millis =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  std::string line =
      std::string(stamp) + "." + std::to_string(1000 + millis).substr(1) + "Z " + kTags[static_cast<int>(level)] + " ";
  // A message of several lines (a job's memory plan) continues on lines indented by four spaces, so that every
  // line of the log either starts with a time or visibly belongs to the one above.
  for (char c : message) {
    line += c;
    if (c == '\n') line += "    ";
  }
  while (!line.empty() && (line.back() == ' ' || line.back() == '\n')) line.pop_back();
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);  // one call per line: stdio locks the stream for it
  std::fflush(stderr);
}

}  // namespace slide
