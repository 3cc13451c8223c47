#include "engine/common/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/common/path_confinement.h"

namespace slide {
namespace {
Status Errno(const std::string& what, const std::string& path) {
  return Status(StatusCode::kFailedPrecondition, what + " '" + path + "': " + std::strerror(errno));
}
}  // namespace

Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return InvalidArgument("empty directory path");
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty() || partial == "/") continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return Errno("cannot create directory", partial);
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status(StatusCode::kFailedPrecondition, "'" + dir + "' is not a directory");
  return Status::Ok();
}

Status RemoveTree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Status::Ok();
  auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); };
  if (::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0) return Errno("cannot remove", path);
  return Status::Ok();
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  SLIDE_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return Internal(path + ": read failed (" + std::strerror(e) + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  return WriteFileAtomicAt(AT_FDCWD, path, content);
}

Status WriteFileAtomicAt(int dir_fd, const std::string& name, const std::string& content) {
  const std::string tmp = name + ".tmp";
  ::unlinkat(dir_fd, tmp.c_str(), 0);  // a stale temporary, or a link planted there, is never written through
  const int fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return Errno("cannot write", tmp);
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status st = Errno("cannot write", tmp);
      ::close(fd);
      ::unlinkat(dir_fd, tmp.c_str(), 0);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  Status synced = ::fsync(fd) == 0 ? Status::Ok() : Errno("cannot sync", tmp);
  if (::close(fd) != 0 && synced.ok()) synced = Errno("cannot close", tmp);
  if (!synced.ok()) {
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return synced;
  }
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) return Errno("cannot rename onto", name);
  return SyncDirectoryOf(dir_fd, name);
}

Status SyncDirectoryOf(int dir_fd, const std::string& name) {
  // The rename is durable only once the directory holding the new entry is synced.
  int dfd = -1;
  if (dir_fd != AT_FDCWD && name.find('/') == std::string::npos) {
    dfd = ::dup(dir_fd);
  } else {
    const size_t slash = name.find_last_of('/');
    const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : name.substr(0, slash);
    dfd = ::openat(dir_fd, parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  if (dfd < 0) return Errno("cannot open the directory of", name);
  const bool ok = ::fsync(dfd) == 0 || errno == EINVAL;  // some filesystems cannot sync a directory
  Status st = ok ? Status::Ok() : Errno("cannot sync the directory of", name);
  ::close(dfd);
  return st;
}

StatusOr<OutputDirectory> OutputDirectory::Open(const std::string& path, const std::vector<std::string>& roots) {
  SLIDE_RETURN_IF_ERROR(MakeDirs(path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", path);
  OutputDirectory dir(fd, path);
  // What was opened, not what the path said a moment ago: the check and every later write see the same directory.
  char opened[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), opened, sizeof(opened) - 1);
  if (n <= 0) return Errno("cannot tell where this directory is", path);
  const std::string resolved(opened, static_cast<size_t>(n));
  if (!roots.empty()) SLIDE_RETURN_IF_ERROR(CheckJobPath("output_dir", resolved, roots));
  return dir;
}

OutputDirectory& OutputDirectory::operator=(OutputDirectory&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

OutputDirectory::~OutputDirectory() {
  if (fd_ >= 0) ::close(fd_);
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace slide
