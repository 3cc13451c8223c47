// Small filesystem helpers with Status errors that name the path. RemoveTree uses nftw rather than
// std::filesystem::remove_all, which crashes against the private std::filesystem LibTorch's libraries export.
#pragma once

#include <string>

#include "engine/common/status.h"

namespace slide {

Status MakeDirs(const std::string& dir);
Status RemoveTree(const std::string& path);  // no error when it does not exist
StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes through `path`.tmp, fsync and rename: readers see the old or the new content, never a torn file.
Status WriteFileAtomic(const std::string& path, const std::string& content);
bool PathExists(const std::string& path);

}  // namespace slide
