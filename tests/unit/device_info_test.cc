// What the daemon reads and sets about its device and host memory, on any machine.
#include "engine/runtime/device_info.h"

#include <gtest/gtest.h>

namespace slide {
namespace {

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
