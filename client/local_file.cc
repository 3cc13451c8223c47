#include "client/local_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace slidectl {

std::string ReadLocalFile(const std::string& path, const std::string& what, size_t max_bytes, std::string* error) {
  auto fail = [&](const std::string& why) {
    *error = path + ": " + why;
    return std::string();
  };
  // Non-blocking: opening a FIFO must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return fail("cannot open " + what + " (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)                          ? "a directory"
                       : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                       : S_ISSOCK(st.st_mode)                       ? "a socket"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                    : "not a regular file";
    return fail(std::string("is ") + kind + ", not a " + what);
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return fail("is " + std::to_string(st.st_size) + " bytes; a " + what + " is at most " + std::to_string(max_bytes));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return fail("cannot read " + what + " (" + std::strerror(e) + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      return fail("grew past " + std::to_string(max_bytes) + " bytes while it was read");
    }
  }
  ::close(fd);
  error->clear();
  return out;
}

}  // namespace slidectl
