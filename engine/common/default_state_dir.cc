#include "engine/common/default_state_dir.h"

#include <cstdlib>

namespace slide {

StatusOr<std::string> DefaultStateDir() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  const char* home = std::getenv("HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/slideformer";
  if (home != nullptr && home[0] != '\0') return std::string(home) + "/.local/share/slideformer";
  return InvalidArgument("neither XDG_DATA_HOME nor HOME is set");
}

}  // namespace slide
