// The fuzz input as a file, for parsers that read paths: written to a per-process file in /dev/shm (tmpfs), so
// an iteration costs a write, not a disk round trip.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace slide::fuzz {

inline const std::string& InputFile(const char* suffix) {
  static const std::string path = "/dev/shm/slide-fuzz-" + std::to_string(::getpid()) + suffix;
  return path;
}

inline const std::string& WriteInput(const uint8_t* data, size_t size, const char* suffix) {
  const std::string& path = InputFile(suffix);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  return path;
}

}  // namespace slide::fuzz
