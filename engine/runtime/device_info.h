// What the daemon reports about its compute device, without exposing LibTorch types.
#pragma once

#include <cstdint>
#include <string>

namespace slide {

struct DeviceInfo {
  std::string description;  // e.g. "cuda:0 NVIDIA H200 (139.8 GiB)" or "cpu (16 threads, no CUDA device)"
  int64_t total_bytes = 0;  // device memory (0 on the CPU)
};

DeviceInfo DescribeDevice();

// Resident host memory of this process now (VmRSS) and at its peak (VmHWM).
// Physical memory of the machine: the host budget the planner plans against (the daemon owns the box).
int64_t PhysicalHostBytes();
int64_t ResidentHostBytes();
int64_t PeakResidentHostBytes();

// The CUDA caching allocator's counters for device 0 (all zero without CUDA). `segments_allocated` counts
// cudaMalloc calls over the process: constant after the first step means no allocation grew. Reserved less
// allocated at the peaks is what the cached blocks' sizes could not serve (fragmentation across phases).
struct DeviceAllocatorStats {
  int64_t reserved_bytes = 0, peak_reserved_bytes = 0, peak_allocated_bytes = 0;
  int64_t segments_allocated = 0, alloc_retries = 0, ooms = 0;
};
DeviceAllocatorStats ReadDeviceAllocatorStats();

// Caps what the caching allocator may reserve on device 0 at `budget_bytes` (a process-wide limit: past it
// allocations fail with out-of-memory instead of growing). No-op without CUDA.
void LimitDeviceMemory(int64_t budget_bytes);

}  // namespace slide
