// Small filesystem helpers with Status errors that name the path. RemoveTree uses nftw rather than
// std::filesystem::remove_all, which crashes against the private std::filesystem LibTorch's libraries export.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/common/status.h"

namespace slide {

Status MakeDirs(const std::string& dir);
Status RemoveTree(const std::string& path);  // no error when it does not exist
StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes through `path`.tmp, fsync, rename and fsync of the directory: readers see the old or the new content,
// never a torn file, and once it returns OK the new content survives a crash.
Status WriteFileAtomic(const std::string& path, const std::string& content);
// The same for `name` inside the open directory `dir_fd` (AT_FDCWD: relative to the working directory).
Status WriteFileAtomicAt(int dir_fd, const std::string& name, const std::string& content);
// fsync of the directory that holds `name` (relative to `dir_fd`): makes a rename or a new entry durable.
Status SyncDirectoryOf(int dir_fd, const std::string& name);
bool PathExists(const std::string& path);

// A directory a job writes its outputs into, opened once (created when missing) and written only through its
// descriptor (openat/renameat): replacing the path, or a component of it, with a symlink after the open cannot
// redirect a write. Open refuses a directory that resolves outside `roots` (empty: anywhere).
class OutputDirectory {
 public:
  static StatusOr<OutputDirectory> Open(const std::string& path, const std::vector<std::string>& roots);
  OutputDirectory(OutputDirectory&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }
  OutputDirectory& operator=(OutputDirectory&& other) noexcept;
  OutputDirectory(const OutputDirectory&) = delete;
  OutputDirectory& operator=(const OutputDirectory&) = delete;
  ~OutputDirectory();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }  // as opened (for messages)
  Status WriteFileAtomic(const std::string& name, const std::string& content) const {
    return WriteFileAtomicAt(fd_, name, content);
  }

 private:
  OutputDirectory(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace slide
