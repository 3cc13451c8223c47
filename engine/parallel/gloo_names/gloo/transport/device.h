// See ../../README.md: types ProcessGroupGloo.hpp holds by pointer only.
#pragma once

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
