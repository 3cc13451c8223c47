#include "engine/memory/host_array.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace slide {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;

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
