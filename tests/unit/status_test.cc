#include "engine/common/status.h"

#include <gtest/gtest.h>

namespace slide {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  SLIDE_ASSIGN_OR_RETURN(int h, Half(x));
  SLIDE_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(Status, PropagatesTheFirstError) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: 3 is odd");
  EXPECT_EQ(s.WithContext("job 7").message(), "job 7: 3 is odd");
}

}  // namespace
}  // namespace slide
