// Test entry point: fixes LibTorch's thread count so timings and results do not depend on the host.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  at::set_num_threads(2);
  return RUN_ALL_TESTS();
}
