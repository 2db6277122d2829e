// Where a test finds the binaries it starts and the source tree's fixtures, so
// that the same test runs from the build tree and from a packaged dist/ on
// another machine (scripts/package_device.sh; the GPU machine):
//  - the CLI: $KS_CLI, else `kernelsearch` next to the test binary (dist/bin),
//    else the build tree's (KS_CLI_BINARY, set at compile time);
//  - the source tree: $KS_TEST_SOURCE_DIR, else KS_SOURCE_DIR when it exists
//    here, else the working directory (run from a checkout's root).
// Tests name fixtures through SourcePath(), never through KS_SOURCE_DIR itself.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

namespace ks::testing {

inline std::string TestBinaryDir() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : self.parent_path().string();
}

inline std::string CliBinary() {
  if (const char* env = std::getenv("KS_CLI"); env && *env) return env;
  std::string beside = TestBinaryDir() + "/kernelsearch";
  if (!TestBinaryDir().empty() && ::access(beside.c_str(), X_OK) == 0) return beside;
#ifdef KS_CLI_BINARY
  return KS_CLI_BINARY;
#else
  return "kernelsearch";
#endif
}

inline std::string SourceDir() {
  if (const char* env = std::getenv("KS_TEST_SOURCE_DIR"); env && *env) return env;
#ifdef KS_SOURCE_DIR
  if (std::filesystem::exists(std::string(KS_SOURCE_DIR) + "/tests")) return KS_SOURCE_DIR;
#endif
  return std::filesystem::current_path().string();
}

// A file of the source tree by its path from the root: "tests/evaluator/fixtures/x.py".
inline std::string SourcePath(std::string_view relative) { return SourceDir() + "/" + std::string(relative); }

}  // namespace ks::testing
