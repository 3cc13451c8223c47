#include "engine/runtime/device_info.h"

#include <ATen/Context.h>

#include <cstdio>
#include <thread>

#if SLIDE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace slide {

DeviceInfo DescribeDevice() {
  DeviceInfo info;
#if SLIDE_HAVE_CUDA
  if (at::hasCUDA()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      info.cuda = true;
      info.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
      char buf[256];
      std::snprintf(buf, sizeof(buf), "cuda:0 %s (%.1f GiB)", prop.name, info.total_bytes / double(1ll << 30));
      info.description = buf;
      return info;
    }
  }
#endif
  info.description = "cpu (" + std::to_string(std::thread::hardware_concurrency()) + " threads, no CUDA device)";
  return info;
}

}  // namespace slide
