// See ../README.md: the context ProcessGroupGloo.hpp holds by shared_ptr and whose timeout its setTimeout sets
// (defined in libtorch_cpu's Gloo).
#pragma once

#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
