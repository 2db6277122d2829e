// A fresh directory for one test, removed with everything in it when the
// TempDir goes. mkdtemp names it, so parallel test processes (ctest -j) and
// repeated runs never share one. With OnFailure::kKeep it stays where the
// current test has failed, for a look at what the test left (its path is
// printed). Not thread-safe; owned by the test or fixture that declares it —
// declare it before the members that write into it, so it outlives them.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

namespace ks::testing {

class TempDir {
 public:
  enum class OnFailure { kRemove, kKeep };

  // Under $TMPDIR (else /tmp), named `<prefix>XXXXXX`. Aborts the test binary
  // when no directory can be made: nothing else could run either.
  explicit TempDir(std::string_view prefix = "ks_test_", OnFailure on_failure = OnFailure::kRemove)
      : on_failure_(on_failure) {
    std::string tmpl = (std::filesystem::temp_directory_path() / prefix).string() + "XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror(("mkdtemp " + tmpl).c_str());
      std::abort();
    }
    path_ = tmpl;
  }
  ~TempDir() {
    if (on_failure_ == OnFailure::kKeep && ::testing::Test::HasFailure()) {
      std::fprintf(stderr, "kept for a look: %s\n", path_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string string() const { return path_.string(); }
  // A path inside: dir / "lineage.db".
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
  OnFailure on_failure_;
};

}  // namespace ks::testing
