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

// With contents: the array holds them (not zeros), at sizes around the pieces it is written in.
TEST(HostArray, HoldsTheContentsItIsGiven) {
  for (bool huge : {true, false})
    for (int64_t n : {int64_t(1), int64_t(5), (int64_t(16) << 20) + 3}) {  // the last crosses a 64 MiB piece
      const at::Tensor source = at::arange(n, at::kFloat);
      const at::Tensor a = HostArray(n, at::kFloat, huge, source.const_data_ptr());
      EXPECT_TRUE(at::equal(a, source)) << "n " << n << " huge " << huge;
    }
}

// The flags smaps shows for the mapping holding `address` ("" when not found).
std::string VmFlagsOf(const void* address) {
  const auto where = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      in_mapping = begin <= where && where < end;
      continue;
    }
    if (in_mapping && line.rfind("VmFlags:", 0) == 0) return line + " ";
  }
  return "";
}

// The advice reaches the kernel: the huge array's mapping carries MADV_HUGEPAGE's flag ("hg") and starts on a 2 MiB
// boundary, the other carries MADV_NOHUGEPAGE's ("nh"), whatever the kernel had free to give at the time.
TEST(HostArray, AdvisesHugePagesOrAgainstThem) {
  if (!HostHugePagesAvailable()) GTEST_SKIP() << "transparent huge pages are off on this machine";
  at::Tensor huge = HostArray((int64_t(4) << 20) + 3, at::kFloat, true);  // 16 MiB and a bit
  at::Tensor small = HostArray(int64_t(4) << 20, at::kFloat, false);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(huge.data_ptr()) % (uintptr_t(2) << 20), 0u);
  const std::string huge_flags = VmFlagsOf(huge.data_ptr()), small_flags = VmFlagsOf(small.data_ptr());
  if (huge_flags.empty()) GTEST_SKIP() << "this kernel's smaps has no VmFlags";
  EXPECT_NE(huge_flags.find(" hg "), std::string::npos) << huge_flags;
  EXPECT_NE(small_flags.find(" nh "), std::string::npos) << small_flags;
}

}  // namespace
}  // namespace slide
