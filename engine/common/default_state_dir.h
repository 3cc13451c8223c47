// Where slided keeps its state when its config names no directory, and where slidectl looks for the daemon's
// socket and generated token: $XDG_DATA_HOME/slideformer, else ~/.local/share/slideformer.
#pragma once

#include "engine/common/status.h"

namespace slide {

StatusOr<std::string> DefaultStateDir();

}  // namespace slide
