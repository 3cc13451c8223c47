// Status and StatusOr: the engine's error type at its boundary (no exceptions cross it).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace slide {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad user input: config, path, file contents, hyperparameters
  kNotFound,            // a named file, tensor or job does not exist
  kResourceExhausted,   // does not fit the memory budget, or out of memory
  kFailedPrecondition,  // the request is valid but the state does not allow it
  kUnavailable,         // the service is draining or a device is absent
  kUnauthenticated,
  kPermissionDenied,  // authenticated, but the request reaches outside what the daemon allows
  kCancelled,
  kDataLoss,  // a durable file is corrupt
  kInternal,  // a bug or an unexpected library failure
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message"
  std::string ToString() const;
  // Returns a status with the same code and "context: message".
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// `text` from a request or a file, quoted for an error message: at most `max_bytes` of it (cut on a UTF-8
// boundary, with how long the whole was), so that an error never grows with its input (gRPC refuses status
// messages past its metadata limit, and a log line should not carry a megabyte).
std::string QuoteInput(std::string_view text, size_t max_bytes = 96);

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : value_(std::move(status)) {}  // NOLINT: implicit by design
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(value_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(value_); }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<Status, T> value_;
};

}  // namespace slide

#define SLIDE_CONCAT_INNER(a, b) a##b
#define SLIDE_CONCAT(a, b) SLIDE_CONCAT_INNER(a, b)

#define SLIDE_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::slide::Status slide_status_ = (expr);        \
    if (!slide_status_.ok()) return slide_status_; \
  } while (0)

#define SLIDE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define SLIDE_ASSIGN_OR_RETURN(lhs, expr) \
  SLIDE_ASSIGN_OR_RETURN_IMPL(SLIDE_CONCAT(slide_statusor_, __LINE__), lhs, expr)
