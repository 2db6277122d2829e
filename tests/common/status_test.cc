#include "common/status.h"

#include <gtest/gtest.h>

namespace ks {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  KS_ASSIGN_OR_RETURN(int h, Half(x));
  KS_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndErrorsCarryCodeAndContext) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = NotFound("x.py").WithContext("loading problem");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), "loading problem: x.py");
  EXPECT_EQ(s.ToString(), "NOT_FOUND: loading problem: x.py");
}

TEST(StatusTest, AssignOrReturnPropagatesTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "3 is odd");
}

}  // namespace
}  // namespace ks
