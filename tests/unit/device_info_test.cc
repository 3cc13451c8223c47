// What the daemon reads and sets about its device and host memory, on any machine.
#include "engine/runtime/device_info.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace slide {
namespace {

// The daemon describes its device at start-up, before any CUDA work: the allocator's stats are zero then, not an
// exception (on a GPU box slided aborted at start with "Invalid device argument"). ctest runs each test in its own
// process, so on a CUDA machine this reads them before LibTorch has initialised CUDA; then again after some work.
TEST(DeviceInfo, AllocatorStatsBeforeAnyCudaWorkAreZero_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine";
  DeviceAllocatorStats before;
  ASSERT_NO_THROW(before = ReadDeviceAllocatorStats());
  ASSERT_NO_THROW(RestartDevicePeak());
  ASSERT_NO_THROW((void)DeviceSegmentsExpandable());
  const at::Tensor t = at::ones({1 << 20}, at::TensorOptions().device(at::kCUDA));
  const DeviceAllocatorStats after = ReadDeviceAllocatorStats();
  EXPECT_GE(after.allocated_bytes, before.allocated_bytes + (4 << 20));
}

TEST(DeviceInfo, ExpandableSegmentsJoinTheUsersAllocatorSettings) {
  EXPECT_EQ(AllocatorSettingsWithExpandableSegments(""), "expandable_segments:True");
  // Applying settings resets those they do not name: the user's own travel along.
  EXPECT_EQ(AllocatorSettingsWithExpandableSegments("max_split_size_mb:512"),
            "max_split_size_mb:512,expandable_segments:True");
  // The user's choice stands, either way.
  EXPECT_EQ(AllocatorSettingsWithExpandableSegments("expandable_segments:False"), "");
  EXPECT_EQ(AllocatorSettingsWithExpandableSegments("garbage_collection_threshold:0.6,expandable_segments:True"), "");
  EXPECT_EQ(AllocatorSettingsWithExpandableSegments("backend:cudaMallocAsync"), "");  // no such segments there
}

// PYTORCH_CUDA_ALLOC_CONF first, as LibTorch reads them; the environment is restored after.
TEST(DeviceInfo, UserAllocatorSettingsComeFromEitherVariable) {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    const char* v = std::getenv(name);
    saved.emplace_back(name, v != nullptr ? std::optional<std::string>(v) : std::nullopt);
    ::unsetenv(name);
  }
  EXPECT_EQ(UserAllocatorSettings(), "");
  ::setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:256", 1);
  EXPECT_EQ(UserAllocatorSettings(), "max_split_size_mb:256");
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False", 1);
  EXPECT_EQ(UserAllocatorSettings(), "expandable_segments:False");
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "", 1);  // set but empty: the other one
  EXPECT_EQ(UserAllocatorSettings(), "max_split_size_mb:256");
  for (const auto& [name, value] : saved) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
}

TEST(DeviceInfo, HostMemoryIsReadFromTheSystem) {
  EXPECT_GT(PhysicalHostBytes(), 0);
  EXPECT_GT(ResidentHostBytes(), 0);
  EXPECT_GE(PeakResidentHostBytes(), ResidentHostBytes());
}

TEST(DeviceInfo, WithoutCudaTheAllocatorCountsNothingAndTakesNoLimit) {
  if (DescribeDevice().total_bytes > 0) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_NE(DescribeDevice().description.find("no CUDA device"), std::string::npos);
  LimitDeviceMemory(int64_t(1) << 30);
  RestartDevicePeak();
  const DeviceAllocatorStats stats = ReadDeviceAllocatorStats();
  EXPECT_FALSE(DeviceSegmentsExpandable());
  EXPECT_EQ(stats.device_allocations, 0);
  EXPECT_EQ(stats.peak_allocated_bytes, 0);
}

}  // namespace
}  // namespace slide
