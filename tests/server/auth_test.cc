// The bearer-token check and token loading.
#include "server/auth.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "common/files.h"
#include "tests/testing/temp_dir.h"

namespace ks::server {
namespace {

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

TEST(TokenAuth, AcceptsOnlyTheExactBearerToken) {
  TokenAuth auth(kToken);
  std::string good = std::string("Bearer ") + kToken;
  EXPECT_TRUE(auth.Check({good}).ok());
  EXPECT_TRUE(auth.Check({std::string("bearer ") + kToken}).ok());  // the scheme is case-insensitive
  EXPECT_EQ(auth.Check({}).code(), Code::kUnauthenticated);
  EXPECT_EQ(auth.Check({kToken}).code(), Code::kUnauthenticated);  // no scheme
  EXPECT_EQ(auth.Check({std::string("Basic ") + kToken}).code(), Code::kUnauthenticated);
  EXPECT_EQ(auth.Check({"Bearer "}).code(), Code::kUnauthenticated);
  EXPECT_EQ(auth.Check({good + "0"}).code(), Code::kUnauthenticated);  // a prefix of the sent value
  EXPECT_EQ(auth.Check({good.substr(0, good.size() - 1)}).code(), Code::kUnauthenticated);
  std::string flipped = good;
  flipped.back() = 'X';
  EXPECT_EQ(auth.Check({flipped}).code(), Code::kUnauthenticated);
  EXPECT_EQ(auth.Check({good, good}).code(), Code::kUnauthenticated);  // ambiguous
}

TEST(TokenAuth, RejectionNeverEchoesWhatWasSent) {
  TokenAuth auth(kToken);
  Status s = auth.Check({"Bearer secret-guess-1234567890"});
  EXPECT_EQ(s.message().find("secret-guess"), std::string::npos) << s.message();
}

TEST(ConstantTimeEquals, ComparesContent) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

class LoadTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = getenv(kTokenEnv) ? std::optional<std::string>(getenv(kTokenEnv)) : std::nullopt;
    unsetenv(kTokenEnv);
    path_ = (dir_ / "token").string();
  }
  void TearDown() override {
    if (saved_) setenv(kTokenEnv, saved_->c_str(), 1); else unsetenv(kTokenEnv);
  }
  std::optional<std::string> saved_;
  ks::testing::TempDir dir_{"ks_auth_test_"};
  std::string path_;
};

TEST_F(LoadTokenTest, FileWinsAndTrailingNewlineIsDropped) {
  ASSERT_TRUE(WriteFile(path_, std::string(kToken) + "\n").ok());
  setenv(kTokenEnv, "ffffffffffffffffffffffffffffffff", 1);
  auto t = LoadToken(path_);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, kToken);
}

TEST_F(LoadTokenTest, EnvironmentWhenNoFile) {
  setenv(kTokenEnv, kToken, 1);
  auto t = LoadToken("");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, kToken);
}

TEST_F(LoadTokenTest, RefusesMissingShortAndOddTokens) {
  EXPECT_EQ(LoadToken("").status().code(), Code::kFailedPrecondition);  // neither source
  EXPECT_FALSE(LoadToken(path_ + ".absent").ok());
  ASSERT_TRUE(WriteFile(path_, "short\n").ok());
  EXPECT_EQ(LoadToken(path_).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(WriteFile(path_, "\n").ok());
  EXPECT_EQ(LoadToken(path_).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(WriteFile(path_, "0123456789 abcdef0123456789abcdef").ok());
  EXPECT_EQ(LoadToken(path_).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ks::server
