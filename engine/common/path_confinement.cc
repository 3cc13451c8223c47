#include "engine/common/path_confinement.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace slide {
namespace {

thread_local const std::vector<std::string>* t_roots = nullptr;

// The root `resolved` lies under, or "" (roots are resolved too, so a root given through a symlink works).
bool InsideRoots(const std::string& resolved, const std::vector<std::string>& roots, std::string* allowed) {
  for (const auto& root : roots) {
    auto r = ResolvePath(root);
    if (!r.ok()) continue;
    const std::string& base = r.value();
    if (resolved == base || base == "/" || resolved.rfind(base + "/", 0) == 0) return true;
    *allowed += (allowed->empty() ? "" : ", ") + base;
  }
  return false;
}

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

Status NotRegular(const std::string& path, mode_t mode) {
  return InvalidArgument(path + ": is " + std::string(FileKind(mode)) + ", not a regular file");
}

}  // namespace

StatusOr<std::string> ResolvePath(const std::string& path) {
  std::string existing = path, rest;
  while (true) {
    char buf[PATH_MAX];
    if (::realpath(existing.c_str(), buf) != nullptr) {
      std::string out = buf;
      if (!rest.empty()) out += (out == "/" ? "" : "/") + rest;
      return out;
    }
    const size_t slash = existing.find_last_of('/');
    if (slash == std::string::npos || existing == "/") break;
    const std::string leaf = existing.substr(slash + 1);
    if (leaf == "..") return InvalidArgument("'" + path + "' climbs out of a directory that does not exist");
    if (!leaf.empty() && leaf != ".") rest = rest.empty() ? leaf : leaf + "/" + rest;
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  return InvalidArgument("cannot resolve '" + path + "'");
}

Status CheckJobPath(const std::string& field, const std::string& path, const std::vector<std::string>& roots) {
  if (path.empty() || path[0] != '/')
    return InvalidArgument("job field '" + field + "' must be an absolute path, got '" + path + "'");
  if (roots.empty()) return Status::Ok();
  auto r = ResolvePath(path);
  if (!r.ok()) return r.status().WithContext("job field '" + field + "'");
  const std::string& resolved = r.value();
  std::string allowed;
  if (InsideRoots(resolved, roots, &allowed)) return Status::Ok();
  return Status(StatusCode::kPermissionDenied, "job field '" + field + "': '" + path + "' (resolved to '" + resolved +
                                                   "') is outside the allowed roots (" + allowed + ")");
}

ScopedFileConfinement::ScopedFileConfinement(std::vector<std::string> roots)
    : roots_(std::move(roots)), previous_(t_roots) {
  t_roots = roots_.empty() ? nullptr : &roots_;
}

ScopedFileConfinement::~ScopedFileConfinement() { t_roots = previous_; }

StatusOr<int> OpenRegularFile(const std::string& path) {
  auto outside = [&](const std::string& resolved, const std::string& allowed) {
    return Status(StatusCode::kPermissionDenied,
                  path + ": resolves to '" + resolved + "', outside the allowed roots (" + allowed + ")");
  };
  std::string allowed;
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) {
    const int e = errno;
    // Whether a path outside the roots exists is not told: such paths get the confinement error.
    if (t_roots != nullptr) {
      auto partial = ResolvePath(path);
      if (partial.ok() && !InsideRoots(partial.value(), *t_roots, &allowed)) return outside(partial.value(), allowed);
    }
    return Status(e == ENOENT ? StatusCode::kNotFound : StatusCode::kInvalidArgument,
                  path + ": cannot open (" + std::strerror(e) + ")");
  }
  const std::string resolved = buf;
  if (t_roots != nullptr && !InsideRoots(resolved, *t_roots, &allowed)) return outside(resolved, allowed);
  // The resolved path, without following a link swapped in since; non-blocking so a FIFO never hangs open().
  const int fd = ::open(resolved.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int e = errno;
    return Status(e == ENOENT ? StatusCode::kNotFound : StatusCode::kInvalidArgument,
                  path + ": cannot open (" + std::strerror(e) + ")");
  }
  if (t_roots != nullptr) {
    // O_NOFOLLOW guards only the last component: a directory on the way swapped for a symlink between realpath
    // and open would lead elsewhere, so check what was actually opened.
    char opened[PATH_MAX];
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = ::readlink(link.c_str(), opened, sizeof(opened) - 1);
    if (n <= 0 || std::string(opened, static_cast<size_t>(n)) != resolved) {
      ::close(fd);
      return Status(StatusCode::kPermissionDenied, path + ": changed while it was being opened");
    }
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return NotRegular(path, st.st_mode);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    ::close(fd);
    return Internal(path + ": cannot clear O_NONBLOCK (" + std::strerror(errno) + ")");
  }
  return fd;
}

Status CheckRegularFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    return Status(e == ENOENT ? StatusCode::kNotFound : StatusCode::kInvalidArgument, path + ": " + std::strerror(e));
  }
  return S_ISREG(st.st_mode) ? Status::Ok() : NotRegular(path, st.st_mode);
}

}  // namespace slide
