// Files a job may open: every path is resolved (symlinks and ".." followed) and must lie under one of the
// allowed roots, and only regular files are opened. The daemon confines a job by holding a
// ScopedFileConfinement on the thread that plans or runs it; every engine file read goes through
// OpenRegularFile, so a symlinked file inside an allowed directory cannot reach outside it, and nothing is read
// from a file outside the roots (errors name paths, never quote such a file's bytes). A FIFO, socket or
// device is refused without blocking (O_NONBLOCK + fstat).
#pragma once

#include <string>
#include <vector>

#include "engine/common/status.h"

namespace slide {

// realpath of the deepest existing ancestor + the rest (which may not contain ".."), for paths that may not
// exist yet (an output directory).
StatusOr<std::string> ResolvePath(const std::string& path);

// `path` must be absolute and, when `roots` is not empty, resolve inside one of them. `field` names the job
// field in errors (PERMISSION_DENIED outside the roots).
Status CheckJobPath(const std::string& field, const std::string& path, const std::vector<std::string>& roots);

// While alive, OpenRegularFile on this thread refuses files that resolve outside `roots` (empty: no
// confinement). Scopes nest; the innermost applies.
class ScopedFileConfinement {
 public:
  explicit ScopedFileConfinement(std::vector<std::string> roots);
  ~ScopedFileConfinement();
  ScopedFileConfinement(const ScopedFileConfinement&) = delete;
  ScopedFileConfinement& operator=(const ScopedFileConfinement&) = delete;

 private:
  std::vector<std::string> roots_;
  const std::vector<std::string>* previous_;
};

// Opens `path` for reading: resolved, checked against the thread's confinement, refused unless it is a
// regular file (a directory, FIFO, socket or device gets an error saying which). Returns a blocking fd the
// caller closes. NOT_FOUND when it does not exist.
StatusOr<int> OpenRegularFile(const std::string& path);

// Whether `path` is an existing regular file, or an error saying what else it is (for checks at submission).
Status CheckRegularFile(const std::string& path);

}  // namespace slide
