// What the problem_*_test.cc files share (they make one binary, problem_test):
// the evaluator's fixture problems, reading a reference set's tensors, CPU
// reference options and running the real `kernelsearch` binary (found as
// tests/testing/paths.h finds it, so that a packaged dist/ runs these too).
#pragma once

// It also holds the includes and names every one of those files uses (the
// ks namespace's test-only prelude), so that each file starts at its tests.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/problem.h"
#include "evaluator/reference/bridge_internal.h"
#include "evaluator/reference/reference_cache.h"
#include "tests/testing/paths.h"
#include "tests/testing/skip.h"
#include "tests/testing/temp_dir.h"

namespace ks::problem_test {

// A problem of tests/evaluator/fixtures/ by its file name.
inline std::string Fixture(const std::string& name) {
  return ks::testing::SourcePath("tests/evaluator/fixtures/") + name;
}

// matmul.py: inputs 64x32 + 32x48 fp32, output 64x48 fp32, no parameters.
constexpr uint64_t kMatmulSetBytes = (64 * 32 + 32 * 48 + 64 * 48) * 4;

inline std::vector<float> ReadFloats(const ReferenceData& d, int set, const std::string& name) {
  auto path = d.FilePath(set, name);
  KS_CHECK(path.ok());
  const TensorSpec* spec = d.signature.Find(name);
  KS_CHECK(spec != nullptr);
  auto bytes = ReadTensorFile(*path, *spec);
  KS_CHECK(bytes.ok());
  std::vector<float> v(bytes->size() / sizeof(float));
  std::memcpy(v.data(), bytes->data(), bytes->size());
  return v;
}

inline ReferenceOptions CpuOptions(const std::string& cache, int sets = 2, uint64_t seed = 42) {
  ReferenceOptions o;
  o.sets = sets;
  o.seed = seed;
  o.device = "cpu";
  o.cache_dir = cache;
  return o;
}

inline SubprocessResult RunCli(std::vector<std::string> args) {
  SubprocessOptions o;
  o.argv = {ks::testing::CliBinary()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.timeout_s = 300;
  auto r = RunSubprocess(o);
  KS_CHECK(r.ok());
  return *r;
}

}  // namespace ks::problem_test

// The names the problem_*_test.cc files use unqualified.
namespace ks {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ks::problem_test::CpuOptions;
using ks::problem_test::Fixture;
using ks::problem_test::kMatmulSetBytes;
using ks::problem_test::ReadFloats;
using ks::problem_test::RunCli;
using ks::testing::TempDir;
}  // namespace ks
