#include "engine/common/host_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace slide {

bool HugePageAdviceWanted() {
  static const bool wanted = [] {
    if (const char* env = std::getenv("SLIDE_HUGEPAGES"); env != nullptr && std::string(env) == "0") return false;
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string modes;
    std::getline(f, modes);
    return modes.find("[madvise]") != std::string::npos;
  }();
  return wanted;
}

void AdviseHugePages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (p == nullptr || !HugePageAdviceWanted()) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice: failure is harmless
}

}  // namespace slide
