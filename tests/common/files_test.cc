#include "common/files.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

TEST(FilesTest, WriteThenReadRoundTrips) {
  ks::testing::TempDir dir("ks_files_test_");
  std::string p = (dir / "data.txt").string();
  ASSERT_TRUE(WriteFile(p, "data\n").ok());
  auto r = ReadFile(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "data\n");
}

TEST(FilesTest, MissingFileNamesThePath) {
  auto r = ReadFile("/nonexistent/ks.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/ks.txt"), std::string::npos);
}

TEST(FilesTest, OversizedFileIsRefused) {
  ks::testing::TempDir dir("ks_files_test_");
  std::string p = (dir / "big.txt").string();
  ASSERT_TRUE(WriteFile(p, std::string(2000, 'x')).ok());
  auto r = ReadFile(p, 1000);
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted);
}

TEST(FilesTest, Sha256MatchesKnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(std::string(1000, 'a')).substr(0, 16), "41edece42d63e8d9");
}

}  // namespace
}  // namespace ks
