// Job files for `slidectl submit`: YAML whose keys are slide.v1.JobSpec fields. Unknown keys and wrong types are
// errors naming the key and line; relative paths are taken from the file's directory.
#pragma once

#include <string>

#include "slide/v1/slide.pb.h"

namespace slidectl {

constexpr size_t kMaxJobFileBytes = 1 << 20;

// Returns "" on success, else one line: "FILE:LINE: message" (or "FILE: why" when it cannot be read).
std::string LoadJobFile(const std::string& path, slide::v1::JobSpec* spec);

}  // namespace slidectl
