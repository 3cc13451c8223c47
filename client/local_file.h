// The files slidectl itself reads (a job file, a CA certificate, a token file): each must be a readable regular
// file of bounded size. A directory, FIFO, device, unreadable or oversized path gets one line saying which,
// never an exception or a hang.
#pragma once

#include <cstddef>
#include <string>

namespace slidectl {

// The file's content, or "" with `*error` set to "PATH: why" (`what` names the file's role, e.g. "job file").
std::string ReadLocalFile(const std::string& path, const std::string& what, size_t max_bytes, std::string* error);

}  // namespace slidectl
