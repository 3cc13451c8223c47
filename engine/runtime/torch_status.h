// The engine's boundary for LibTorch's exceptions: runs a body that may throw (TORCH_CHECK and other c10 errors, a
// worker's rethrown std::exception) so that what it throws comes back as a status: device or host memory exhausted
// as RESOURCE_EXHAUSTED, anything else as INTERNAL with its message. Used where statuses leave the trainer and the job.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "engine/common/status.h"

namespace slide {

// `body` returns StatusOr<T> (or something it converts to); so does this.
template <typename T, typename F>
StatusOr<T> StatusFromExceptions(F&& body) {
  try {
    return body();
  } catch (const c10::OutOfMemoryError& e) {
    return ResourceExhausted(std::string("out of memory: ") + e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return Internal(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal(e.what());
  }
}

}  // namespace slide
