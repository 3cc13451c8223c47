// What the daemon reports about its compute device, without exposing LibTorch types.
#pragma once

#include <cstdint>
#include <string>

namespace slide {

struct DeviceInfo {
  std::string description;  // e.g. "cuda:0 NVIDIA H200 (139.8 GiB)" or "cpu (16 threads, no CUDA device)"
  bool cuda = false;
  int64_t total_bytes = 0;  // device memory (0 on the CPU)
};

DeviceInfo DescribeDevice();

}  // namespace slide
