#include "engine/common/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // a stale temporary, or a link planted there, is never written through
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return Errno("cannot write", tmp);
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status st = Errno("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return st;
    }
    done += static_cast<size_t>(n);
  }
  Status synced = ::fsync(fd) == 0 ? Status::Ok() : Errno("cannot sync", tmp);
  if (::close(fd) != 0 && synced.ok()) synced = Errno("cannot close", tmp);
  if (!synced.ok()) {
    ::unlink(tmp.c_str());
    return synced;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("cannot rename onto", path);
  return Status::Ok();
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace slide
