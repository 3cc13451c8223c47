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

// The CUDA caching allocator's counters for device 0 (all zero without CUDA). `device_allocations` counts the
// process's cudaMalloc calls and expandable-segment mappings: constant after the first step means no allocation
// grew. Reserved less allocated at the peaks is what the cached blocks could not serve (fragmentation).
struct DeviceAllocatorStats {
  int64_t reserved_bytes = 0, peak_reserved_bytes = 0, allocated_bytes = 0, peak_allocated_bytes = 0;
  int64_t device_allocations = 0, alloc_retries = 0, ooms = 0;
};
DeviceAllocatorStats ReadDeviceAllocatorStats();

// Whether the caching allocator holds expandable segments on device 0 (grown by mapping pages instead of cached
// as fixed blocks): false without CUDA or before any allocation. Walks the allocator's segments (not per step).
bool DeviceSegmentsExpandable();

// From now on the allocated-bytes peak counts from what is allocated now (a phase's own peak; the process-wide
// peak is lost). No-op without CUDA.
void RestartDevicePeak();

// Caps what the caching allocator may reserve on device 0 at `budget_bytes` (a process-wide limit: past it
// allocations fail with out-of-memory instead of growing), and turns on expandable segments unless
// PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF names that setting: a step's phases free and allocate blocks of
// different sizes (a layer's activations, the head's logits), and fixed cached segments kept 2.6-7.1 GB of the
// 24 GiB budget that no later phase could use (one H100 box; 1.5-2.2 GB less reserved with them). No-op
// without CUDA.
void LimitDeviceMemory(int64_t budget_bytes);

// The user's allocator settings: PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF (empty when neither is set).
std::string UserAllocatorSettings();

// The allocator settings LimitDeviceMemory applies given the user's (UserAllocatorSettings): theirs with
// expandable segments added (applying settings resets every setting they do not name), or empty where theirs
// already name expandable segments (their choice stands) or choose the cudaMallocAsync backend.
std::string AllocatorSettingsWithExpandableSegments(const std::string& user_settings);

}  // namespace slide
