// Deeply nested JSON from a model is refused before it is built (issue 31:
// a reply nested 150,000 levels deep overflowed the stack when copied).
#include "common/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace ks {
namespace {

TEST(JsonDepthTest, CountsNestingOutsideStringsInOnePass) {
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": [2]}]})", 100), 4);
  EXPECT_EQ(JsonNestingDepth(R"({"s": "[[[[{{{{\"]]"})", 100), 1);  // brackets in strings do not count
  EXPECT_EQ(JsonNestingDepth("", 100), 0);
}

TEST(JsonDepthTest, A150kLevelReplyIsRefusedWithoutRecursion) {
  const std::string deep = std::string(150000, '[') + std::string(150000, ']');
  EXPECT_GT(JsonNestingDepth(deep, kMaxModelJsonDepth), kMaxModelJsonDepth);
  Status st = CheckJsonNesting(deep, kMaxModelJsonDepth, "the reply");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the reply nests [ ] and { } deeper than 256 levels"), std::string::npos);
  EXPECT_TRUE(CheckJsonNesting("[[1]]", 2, "x").ok());
  EXPECT_FALSE(CheckJsonNesting("[[[1]]]", 2, "x").ok());
}

}  // namespace
}  // namespace ks
