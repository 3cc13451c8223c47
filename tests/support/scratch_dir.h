// Helpers of the NVMe tier's tests: the backends to run, and a scratch directory on a disk (/var/tmp, not
// tmpfs, so O_DIRECT works) removed with its files.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/io/io_backend.h"

namespace slide {

// The I/O backends this build can run: pread/pwrite always, io_uring when built with liburing.
inline std::vector<std::string> Backends() {
  std::vector<std::string> b = {"pread"};
  if (IoUringCompiledIn()) b.push_back("io_uring");
  return b;
}

class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/var/tmp/slide-nvme-XXXXXX";  // a disk, not tmpfs: O_DIRECT works there
    path_ = ::mkdtemp(tmpl);
  }
  ~ScratchDir() {
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') ::unlink((path_ + "/" + e->d_name).c_str());
      ::closedir(d);
    }
    ::rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') out.push_back(path_ + "/" + e->d_name);
      ::closedir(d);
    }
    return out;
  }

 private:
  std::string path_;
};

}  // namespace slide
