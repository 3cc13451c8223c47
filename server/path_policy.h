// Job paths confined to configured roots. Paths are resolved (symlinks, "..") before the check, so a link or
// a relative hop cannot leave the roots; a path that does not exist yet (the output directory) is resolved
// through its deepest existing ancestor.
#pragma once

#include <string>
#include <vector>

#include "engine/common/status.h"

namespace slide {

// `field` names the job field in errors. Empty `roots` allows any absolute path.
Status CheckJobPath(const std::string& field, const std::string& path, const std::vector<std::string>& roots);

}  // namespace slide
