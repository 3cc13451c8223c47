// The daemon's log: one line per event on stderr, "2026-12-03T14:59:00.123Z INFO  message" (UTC, milliseconds),
// below the configured level dropped. Lines are written whole, so threads never interleave within one; a message
// of several lines continues on lines indented by four spaces.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace slide {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// "debug", "info", "warning" or "error"; nullopt for anything else.
std::optional<LogLevel> ParseLogLevel(std::string_view name);
const char* LogLevelName(LogLevel level);

void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

void Log(LogLevel level, const std::string& message);
inline void LogInfo(const std::string& message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(const std::string& message) { Log(LogLevel::kWarning, message); }
inline void LogError(const std::string& message) { Log(LogLevel::kError, message); }

}  // namespace slide
