#include "engine/memory/host_array.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "engine/common/thread_pool.h"

namespace slide {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kSmallPage = size_t(4) << 10;
constexpr size_t kTouchPiece = size_t(64) << 20;  // a multiple of kHugePage

}  // namespace

at::Tensor HostArray(int64_t numel, c10::ScalarType dtype, bool huge_pages, const void* contents) {
  TORCH_CHECK(numel >= 0, "a host array needs a non-negative size, got ", numel);
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  // Huge: whole 2 MiB pages from a 2 MiB boundary (kernels before ~6.7 do not align anonymous mappings), so no part
  // of the array is left on small pages; small: whole 4 KiB pages. At least one page for an empty array.
  const size_t unit = huge_pages ? kHugePage : kSmallPage;
  const size_t mapped = std::max<size_t>(1, (bytes + unit - 1) / unit) * unit;
  const size_t reserved = huge_pages ? mapped + kHugePage : mapped;
  void* raw = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(raw != MAP_FAILED, "mapping ", reserved, " bytes of host memory: ", std::strerror(errno));
  char* p = static_cast<char*>(raw);
  if (huge_pages) {  // keep the aligned `mapped` bytes, give back the slack on either side
    const uintptr_t address = reinterpret_cast<uintptr_t>(raw);
    char* aligned = p + ((kHugePage - address % kHugePage) % kHugePage);
    if (aligned > p) munmap(p, static_cast<size_t>(aligned - p));
    if (aligned + mapped < p + reserved)
      munmap(aligned + mapped, static_cast<size_t>(p + reserved - (aligned + mapped)));
    p = aligned;
  }
  // Advice only: refused where THP is compiled out. Small pages are asked for explicitly, so "off" means small
  // pages where THP is "always" too.
  (void)madvise(p, mapped, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  // Faulted in now, in parallel pieces, rather than by the first update that writes them: left untouched, 8B's
  // moments made the first timed step take 9.5 s on huge pages and 50 s on small ones, against 3.9 s after it.
  // Each piece is written once: the contents where given, zeros past them.
  const int64_t pieces = static_cast<int64_t>((mapped + kTouchPiece - 1) / kTouchPiece);
  const size_t copied = contents != nullptr ? bytes : 0;
  ThreadPool::Default().ParallelFor(pieces, [&](int64_t i) {
    const size_t begin = static_cast<size_t>(i) * kTouchPiece, end = std::min(begin + kTouchPiece, mapped);
    const size_t split = std::clamp(copied, begin, end);
    if (split > begin) std::memcpy(p + begin, static_cast<const char*>(contents) + begin, split - begin);
    if (end > split) std::memset(p + split, 0, end - split);
  });
  try {
    return at::from_blob(
        p, {numel}, [mapped](void* q) { munmap(q, mapped); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
  } catch (...) {
    munmap(p, mapped);
    throw;
  }
}

bool HostHugePagesAvailable() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(f, modes);  // e.g. "always [madvise] never": the bracketed mode is the active one
  return modes.find("[always]") != std::string::npos || modes.find("[madvise]") != std::string::npos;
}

}  // namespace slide
