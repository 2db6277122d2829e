// Issue 8: every problem of problems/ loads, passes the degenerate-output check,
// and its naive seed candidate (problems/seeds/NAME.cu + .json) evaluates
// correct on the GPU. One test per problem. Skips without a GPU.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "evaluator/compile/candidate_parser.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/gpu_evaluator.h"
#include "evaluator/problem.h"
#include "tests/testing/paths.h"
#include "tests/testing/skip.h"

namespace ks {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> ProblemNames() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(ks::testing::SourcePath("problems")))
    if (e.path().extension() == ".py") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

class ProblemGpuTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ProblemGpuTest, LoadsIsNotDegenerateAndItsSeedIsCorrect) {
  KS_REQUIRE_GPU();
  const std::string dir = ks::testing::SourcePath("problems/");
  const std::string problem = dir + GetParam() + ".py";
  auto warnings = CheckProblem(problem, {}, "cuda");
  ASSERT_TRUE(warnings.ok()) << warnings.status().ToString();
  EXPECT_TRUE(warnings->empty()) << GetParam() << ": " << (warnings->empty() ? "" : warnings->front());
  auto seed = LoadCandidateFiles(dir + "seeds/" + GetParam() + ".cu", "");
  ASSERT_TRUE(seed.ok()) << seed.status().ToString();
  ReferenceOptions ro;
  ro.sets = 1;  // KernelBench sizes: one set keeps the reference to a few GB
  ro.device = "cuda";
  ro.time = true;
  auto ref = PrepareReference(problem, ro);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  auto ev = GpuEvaluator::Create(*ref, {});
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  auto r = (*ev)->EvaluateBatch({*seed});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Evaluation& e = (*r)[0];
  EXPECT_EQ(e.status, EvalStatus::kCorrect) << GetParam() << ": " << e.message;
  if (e.timing && e.eager)
    std::printf("%s: seed %.4f ms, eager %.4f ms\n", GetParam().c_str(), e.timing->median_ms, e.eager->median_ms);
  // Issue 14: how far inside the norm rules an honest (naive) kernel sits.
  for (const auto& o : e.errors)
    std::printf("norm | %s | %s | %.3g | %.3g | %.2g%% | %lld of %lld | %.3g |\n", GetParam().c_str(), o.name.c_str(),
                o.rel_norm, o.rel_norm_bound, o.rel_norm_bound > 0 ? 100 * o.rel_norm / o.rel_norm_bound : 0.0,
                static_cast<long long>(o.large_errors), static_cast<long long>(o.considered), o.max_rel);
}

INSTANTIATE_TEST_SUITE_P(AllProblems, ProblemGpuTest, ::testing::ValuesIn(ProblemNames()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(ProblemLibraryTest, EveryProblemHasASeedCandidate) {
  const std::string dir = ks::testing::SourcePath("problems/");
  ASSERT_GE(ProblemNames().size(), 15u);
  for (const auto& name : ProblemNames()) {
    EXPECT_TRUE(fs::exists(dir + "seeds/" + name + ".cu")) << name;
    EXPECT_TRUE(fs::exists(dir + "seeds/" + name + ".json")) << name;
  }
}

}  // namespace
}  // namespace ks
