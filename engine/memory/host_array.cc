#include "engine/memory/host_array.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "engine/common/thread_pool.h"

namespace slide {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kTouchPiece = size_t(64) << 20;  // a multiple of kHugePage

}  // namespace

at::Tensor HostArray(int64_t numel, c10::ScalarType dtype, bool huge_pages) {
  TORCH_CHECK(numel >= 0, "a host array needs a non-negative size, got ", numel);
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  // Whole huge pages, so the last one is not split; at least one byte mapped for an empty array.
  const size_t mapped = bytes == 0 ? 1 : (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "mapping ", mapped, " bytes of host memory: ", std::strerror(errno));
  // Advice only: refused where THP is off or compiled out, and the pages stay small.
  if (huge_pages) (void)madvise(p, mapped, MADV_HUGEPAGE);
  // Faulted in now, in parallel pieces, rather than by the first update that writes them: left untouched, 8B's
  // moments made the first timed step take 9.5 s on huge pages and 50 s on small ones, against 3.9 s after it.
  const int64_t pieces = static_cast<int64_t>((mapped + kTouchPiece - 1) / kTouchPiece);
  ThreadPool::Default().ParallelFor(pieces, [&](int64_t i) {
    const size_t begin = static_cast<size_t>(i) * kTouchPiece;
    std::memset(static_cast<char*>(p) + begin, 0, std::min(kTouchPiece, mapped - begin));
  });
  return at::from_blob(
      p, {numel}, [mapped](void* q) { munmap(q, mapped); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

bool HostHugePagesAvailable() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(f, modes);  // e.g. "always [madvise] never": the bracketed mode is the active one
  return modes.find("[always]") != std::string::npos || modes.find("[madvise]") != std::string::npos;
}

}  // namespace slide
