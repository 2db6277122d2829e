// GpuEvaluator's setup (issue 33): its phases, the helper cubin from the
// process's memory and from the disk cache (a corrupt entry compiled again),
// and the worker spawned early and initialized at the end. Label gpu.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/files.h"
#include "evaluator/compile/helper_cache.h"
#include "tests/evaluator/gpu_test_util.h"
#include "tests/evaluator/softmax_kernel.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using namespace ks::testing;  // NOLINT

std::string SoftmaxPlan(const std::string& last) {
  return std::string(R"P({"launches": [{"kernel": "softmax_rows", "grid": ["x.shape[0]"], "block": [256],
             "args": ["x", "out", "x.shape[1]", ")P") + last + R"P("]}]})P";
}

std::vector<std::string> Names(const GpuEvaluator& ev) {
  std::vector<std::string> names;
  for (const auto& [name, seconds] : ev.setup_phases()) {
    EXPECT_GE(seconds, 0) << name;
    names.push_back(name);
  }
  return names;
}

std::string HelperPhase(const GpuEvaluator& ev) {
  for (const auto& [name, seconds] : ev.setup_phases())
    if (name.rfind("helper kernels", 0) == 0) return name;
  return "";
}

TEST(SetupGpuTest, PhasesInOrderAndTheHelperCubinCached) {
  KS_REQUIRE_GPU();
  ReferenceOptions ro;
  ro.sets = 2;
  ro.device = "cuda";
  auto ref = PrepareReference(GpuFixture("softmax_small.py"), ro);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  TempDir cache("ks_helper_cache_");
  GpuEvaluatorOptions go;
  go.run_timeout_s = 3;
  go.target_timed_ms = 100;
  go.helper_cache_dir = cache.string();
  ClearHelperCubinMemory();

  auto first = GpuEvaluator::Create(*ref, go);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::vector<std::string> names = Names(**first);
  ASSERT_GE(names.size(), 6u);
  EXPECT_EQ(names.front(), "context");
  EXPECT_EQ(names[1], "worker spawn");
  EXPECT_EQ(names[2], "helper kernels (compile)");
  EXPECT_EQ(names[3], "arena (layout, fill, stage, outputs, bounds)");
  EXPECT_NE(std::find(names.begin(), names.end(), "bandwidth probe"), names.end());
  EXPECT_EQ(names.back(), "worker start");
  double total = 0;
  for (const auto& [name, seconds] : (*first)->setup_phases()) {
    std::printf("  setup %-48s %.3f s\n", name.c_str(), seconds);
    total += seconds;
  }
  std::printf("  setup total %.3f s\n", total);

  // A second evaluator in this process (another GPU would do the same): no compile.
  auto second = GpuEvaluator::Create(*ref, go);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(HelperPhase(**second), "helper kernels (from memory)");
  second->reset();

  // The next command: from disk.
  ClearHelperCubinMemory();
  auto third = GpuEvaluator::Create(*ref, go);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(HelperPhase(**third), "helper kernels (from disk)");
  // The worker, spawned early and initialized last, runs candidates.
  Evaluation e = EvalOne(third->get(), kSoftmax, SoftmaxPlan("x.shape[1]"));
  EXPECT_EQ(e.status, EvalStatus::kCorrect) << e.message << e.worker_log;
  third->reset();

  // A corrupt cache file: compiled again, never a failed setup.
  for (const auto& entry : std::filesystem::directory_iterator(cache.path()))
    ASSERT_TRUE(WriteFile(entry.path().string(), "\x7f" "ELF but not a cubin").ok());
  ClearHelperCubinMemory();
  auto fourth = GpuEvaluator::Create(*ref, go);
  ASSERT_TRUE(fourth.ok()) << fourth.status().ToString();
  EXPECT_EQ(HelperPhase(**fourth), "helper kernels (compile)");
}

TEST(SetupGpuTest, TheWorkerSpawnedEarlyRunsCandidates) {
  KS_REQUIRE_GPU();
  // The shared evaluator (measured setup, worker started) evaluates: the
  // early spawn left nothing behind that a candidate would notice.
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("softmax_small.py"));
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(Names(*ev).back(), "worker start");
  Evaluation e = EvalOne(ev, kSoftmax, SoftmaxPlan("x.shape[1]"));
  EXPECT_EQ(e.status, EvalStatus::kCorrect) << e.message;
}

}  // namespace
}  // namespace ks
