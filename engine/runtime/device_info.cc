#include "engine/runtime/device_info.h"

#include <ATen/Context.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <algorithm>

#if SLIDE_HAVE_CUDA
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace slide {

DeviceInfo DescribeDevice() {
  DeviceInfo info;
#if SLIDE_HAVE_CUDA
  if (at::hasCUDA()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      info.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
      char buf[384];
      std::snprintf(buf, sizeof(buf), "cuda:0 %s (%.1f GiB)", prop.name, info.total_bytes / double(1ll << 30));
      info.description = buf;
      return info;
    }
  }
#endif
  info.description = "cpu (" + std::to_string(std::thread::hardware_concurrency()) + " threads, no CUDA device)";
  return info;
}

#if SLIDE_HAVE_CUDA
namespace {
// The caching allocator's per-device state exists only once LibTorch has initialised CUDA (the first CUDA work, or
// LimitDeviceMemory): before that its stats calls throw "Invalid device argument" (the daemon describes its device
// at start-up, before any job).
bool AllocatorReady() { return at::hasCUDA() && c10::cuda::CUDACachingAllocator::get()->initialized(); }
}  // namespace
#endif

DeviceAllocatorStats ReadDeviceAllocatorStats() {
  DeviceAllocatorStats out;
#if SLIDE_HAVE_CUDA
  if (AllocatorReady()) {
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    constexpr size_t kAll = 0;  // StatType::AGGREGATE
    out.reserved_bytes = s.reserved_bytes[kAll].current;
    out.peak_reserved_bytes = s.reserved_bytes[kAll].peak;
    out.allocated_bytes = s.allocated_bytes[kAll].current;
    out.peak_allocated_bytes = s.allocated_bytes[kAll].peak;
    out.device_allocations = s.num_device_alloc;
    out.alloc_retries = s.num_alloc_retries;
    out.ooms = s.num_ooms;
  }
#endif
  return out;
}

bool DeviceSegmentsExpandable() {
#if SLIDE_HAVE_CUDA
  if (AllocatorReady()) {
    // The allocator's own segments: a setting read through the headers here would report the build of this file
    // (without the driver API's macro), not the allocator's.
    for (const auto& segment : c10::cuda::CUDACachingAllocator::snapshot({0, 0}, /*include_traces=*/false).segments)
      if (segment.is_expandable) return true;
  }
#endif
  return false;
}

void RestartDevicePeak() {
#if SLIDE_HAVE_CUDA
  if (AllocatorReady()) c10::cuda::CUDACachingAllocator::resetPeakStats(0);
#endif
}

std::string UserAllocatorSettings() {
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {  // the CUDA name first, as LibTorch
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return value;
  }
  return "";
}

std::string AllocatorSettingsWithExpandableSegments(const std::string& user_settings) {
  // Named by the user, or another backend than the caching allocator (cudaMallocAsync has no such segments).
  if (user_settings.find("expandable_segments") != std::string::npos ||
      user_settings.find("cudaMallocAsync") != std::string::npos)
    return "";
  return user_settings.empty() ? "expandable_segments:True" : user_settings + ",expandable_segments:True";
}

void LimitDeviceMemory(int64_t budget_bytes) {
#if SLIDE_HAVE_CUDA
  if (at::hasCUDA() && budget_bytes > 0) {
    if (const std::string settings = AllocatorSettingsWithExpandableSegments(UserAllocatorSettings());
        !settings.empty()) {
      try {
        c10::CachingAllocator::setAllocatorSettings(settings);
      } catch (const c10::Error& e) {  // settings this LibTorch refuses: the allocator keeps the ones it had
        std::fprintf(stderr, "slide: allocator settings '%s' not applied: %s\n", settings.c_str(),
                     e.what_without_backtrace());
      }
    }
    at::globalContext().lazyInitDevice(at::kCUDA);  // the allocator must exist before it takes a limit
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && total_bytes > 0)
      c10::cuda::CUDACachingAllocator::setMemoryFraction(std::min(1.0, double(budget_bytes) / double(total_bytes)), 0);
  }
#else
  (void)budget_bytes;
#endif
}

namespace {
int64_t ProcStatusBytes(const std::string& field) {  // a "kB" line of /proc/self/status
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == field) {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}
}  // namespace

int64_t ResidentHostBytes() { return ProcStatusBytes("VmRSS:"); }
int64_t PeakResidentHostBytes() { return ProcStatusBytes("VmHWM:"); }

int64_t PhysicalHostBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

}  // namespace slide
