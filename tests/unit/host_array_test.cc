#include "engine/memory/host_array.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace slide {
namespace {

TEST(HostArray, IsZeroFilledFlatAndWritableAtOddSizes) {
  for (bool huge : {true, false})
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(3), (int64_t(1) << 19) + 5}) {
      for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        at::Tensor a = HostArray(n, dtype, huge);
        ASSERT_EQ(a.dim(), 1);
        ASSERT_EQ(a.numel(), n);
        EXPECT_EQ(a.scalar_type(), dtype);
        EXPECT_TRUE(a.is_cpu() && a.is_contiguous());
        if (n == 0) continue;
        EXPECT_EQ(a.count_nonzero().item<int64_t>(), 0) << "n " << n;
        a.fill_(2.0);  // every element, the last page's included, is writable
        EXPECT_TRUE(a.eq(2.0).all().item<bool>()) << "n " << n;
      }
    }
}

// The huge-page advice reaches the kernel: the mapping is eligible for transparent huge pages ("THPeligible" in
// smaps), whether or not the kernel had a free 2 MiB page to give at the time.
TEST(HostArray, AdvisesHugePagesWhereTheKernelAllowsThem) {
  if (!HostHugePagesAvailable()) GTEST_SKIP() << "transparent huge pages are off on this machine";
  at::Tensor huge = HostArray(int64_t(4) << 20, at::kFloat, true);  // 16 MiB
  const auto address = reinterpret_cast<uintptr_t>(huge.data_ptr());
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_mapping = false, eligible_seen = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      in_mapping = begin <= address && address < end;
      continue;
    }
    if (in_mapping && line.rfind("THPeligible:", 0) == 0) {
      EXPECT_NE(line.find('1'), std::string::npos) << line;
      eligible_seen = true;
    }
  }
  if (!eligible_seen) GTEST_SKIP() << "this kernel's smaps does not report THPeligible";
}

}  // namespace
}  // namespace slide
