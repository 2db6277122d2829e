// Suites (search/suite.h): the fast_p figures and geometric means from rows,
// the order of a level's files, and a whole suite run through the real
// orchestrator and store with the scripted evaluator and a fake model: one row
// per problem, a broken problem a row and not the end, the table KernelBench
// users report, and a cancelled suite resumed without running a finished
// problem again.
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>

#include <gtest/gtest.h>

#include "common/files.h"
#include "search/scripted_evaluator.h"
#include "search/suite.h"
#include "tests/testing/copy_problem.h"
#include "tests/testing/fake_model.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {
namespace fs = std::filesystem;
using ks::testing::FakeModel;
using ks::testing::TempDir;

SuiteProblemResult Row(const std::string& name, bool correct, std::optional<double> eager,
                       std::optional<double> compile) {
  SuiteProblemResult r;
  r.problem = name;
  r.correct = correct;
  r.status = correct ? "correct" : "incorrect";
  if (correct) r.speedup_eager = eager, r.speedup_compile = compile;
  return r;
}

TEST(SuiteFiguresTest, FastPCountsEveryProblemAndIsStrict) {
  std::vector<SuiteProblemResult> rows = {
      Row("a", true, 4.0, 3.0),        // > 2x both
      Row("b", true, 2.0, 0.5),        // exactly 2x eager: fast_1, not fast_2
      Row("c", true, 0.8, 0.4),        // correct but slower
      Row("d", false, std::nullopt, std::nullopt),
      Row("e", true, std::nullopt, std::nullopt),  // correct, no timing: fast_0 only, no geomean
  };
  SuiteFigures f = ComputeSuiteFigures(rows);
  EXPECT_EQ(f.problems, 5);
  EXPECT_EQ(f.correct, 4);
  EXPECT_DOUBLE_EQ(f.fast_eager[0], 4.0 / 5);
  EXPECT_DOUBLE_EQ(f.fast_eager[1], 2.0 / 5);
  EXPECT_DOUBLE_EQ(f.fast_eager[2], 1.0 / 5);
  EXPECT_DOUBLE_EQ(f.fast_compile[0], 4.0 / 5);
  EXPECT_DOUBLE_EQ(f.fast_compile[1], 1.0 / 5);
  EXPECT_DOUBLE_EQ(f.fast_compile[2], 1.0 / 5);
  ASSERT_TRUE(f.geomean_eager.has_value());
  EXPECT_NEAR(*f.geomean_eager, std::cbrt(4.0 * 2.0 * 0.8), 1e-12);
  EXPECT_EQ(f.geomean_eager_n, 3);
  EXPECT_NEAR(*f.geomean_compile, std::cbrt(3.0 * 0.5 * 0.4), 1e-12);

  auto j = SuiteFiguresToJson(f);
  EXPECT_DOUBLE_EQ(j["fast_1_eager"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(j["fast_2_compile"].get<double>(), 0.2);
  std::string table = RenderSuiteFigures(f);
  EXPECT_NE(table.find("80.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("over 3 problems"), std::string::npos) << table;
}

// Issue 36: fast_p against the faster of eager and torch.compile (as
// KernelBench-v3 reports), and the precision contract next to the figures.
TEST(SuiteFiguresTest, FastPAgainstTheFasterBaselineAndTheContractAreReported) {
  std::vector<SuiteProblemResult> rows = {Row("a", true, 4.0, 3.0), Row("b", true, 2.5, 0.9), Row("c", true, 1.5, 1.2)};
  for (auto& r : rows) r.precision = Contract::kKernelBench;
  SuiteFigures f = ComputeSuiteFigures(rows);
  EXPECT_DOUBLE_EQ(f.fast_best[1], 2.0 / 3);  // a (3.0) and c (1.2); b is slower than torch.compile
  EXPECT_DOUBLE_EQ(f.fast_best[2], 1.0 / 3);
  EXPECT_EQ(f.precision, Contract::kKernelBench);
  auto j = SuiteFiguresToJson(f);
  EXPECT_EQ(j["precision"], "kernelbench");
  EXPECT_NEAR(j["fast_1_best"].get<double>(), 2.0 / 3, 1e-12);
  std::string table = RenderSuiteFigures(f);
  EXPECT_NE(table.find("vs the faster"), std::string::npos) << table;
  EXPECT_NE(table.find("precision contract: kernelbench"), std::string::npos) << table;
  rows[0].precision = Contract::kHigh;
  SuiteFigures mixed = ComputeSuiteFigures(rows);
  EXPECT_TRUE(mixed.mixed_precision);
  EXPECT_FALSE(mixed.precision.has_value());
  EXPECT_EQ(SuiteFiguresToJson(mixed)["precision"], "mixed");
  EXPECT_NE(RenderSuiteFigures(mixed).find("precision contract: mixed"), std::string::npos);
  rows[1].precision = rows[2].precision = Contract::kHigh;
  EXPECT_EQ(ComputeSuiteFigures(rows).precision, Contract::kHigh);
  EXPECT_FALSE(ComputeSuiteFigures(rows).mixed_precision);
}

// The contract an evaluation recorded: its name or an older version's alias
// is read as the contract (printed by its name); an unknown one is none, and
// the row's note says so.
TEST(SuiteFiguresTest, AnEvaluationsRecordedContractIsReadOnce) {
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.precision = "tf32";
  SuiteProblemResult r = ResultFromEvaluation("gemm.py", e);
  EXPECT_EQ(r.precision, Contract::kHigh);
  EXPECT_EQ(SuiteProblemResultToJson(r)["precision"], "high");
  e.precision = "";
  EXPECT_FALSE(ResultFromEvaluation("gemm.py", e).precision.has_value());
  EXPECT_FALSE(SuiteProblemResultToJson(ResultFromEvaluation("gemm.py", e)).contains("precision"));
  e.precision = "fp16";
  r = ResultFromEvaluation("gemm.py", e);
  EXPECT_FALSE(r.precision.has_value());
  EXPECT_NE(r.message.find("unknown precision contract 'fp16'"), std::string::npos) << r.message;
}

TEST(SuiteFiguresTest, EmptyAndAllFailedHaveNoGeomean) {
  SuiteFigures none = ComputeSuiteFigures({});
  EXPECT_EQ(none.problems, 0);
  EXPECT_DOUBLE_EQ(none.fast_eager[0], 0);
  SuiteFigures failed = ComputeSuiteFigures({Row("a", false, {}, {}), Row("b", false, {}, {})});
  EXPECT_DOUBLE_EQ(failed.fast_eager[0], 0);
  EXPECT_FALSE(failed.geomean_eager.has_value());
  EXPECT_EQ(SuiteFiguresToJson(failed)["geomean_speedup_eager"], nullptr);
}

TEST(SuiteFilesTest, LevelOrderIsNatural) {
  EXPECT_TRUE(NaturalLess("2_ReLU.py", "10_Conv.py"));
  EXPECT_FALSE(NaturalLess("10_Conv.py", "2_ReLU.py"));
  EXPECT_TRUE(NaturalLess("1_a.py", "1_b.py"));
  EXPECT_TRUE(NaturalLess("9_z.py", "softmax.py"));  // numbered problems first
  TempDir tmp("ks_suite_files_");
  const fs::path& dir = tmp.path();
  for (const char* n : {"10_c.py", "2_b.py", "1_a.py", "__init__.py", "notes.txt"})
    ASSERT_TRUE(WriteFile((dir / n).string(), "").ok());
  auto files = ListProblemFiles({dir.string()});
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ(files->size(), 3u);
  EXPECT_EQ(fs::path((*files)[0]).filename(), "1_a.py");
  EXPECT_EQ(fs::path((*files)[1]).filename(), "2_b.py");
  EXPECT_EQ(fs::path((*files)[2]).filename(), "10_c.py");
  auto missing = ListProblemFiles({(dir / "nope").string()});
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  auto empty_dir = dir / "empty";
  fs::create_directories(empty_dir);
  EXPECT_EQ(ListProblemFiles({empty_dir.string()}).status().code(), Code::kInvalidArgument);
}

// The fake model's kernels, depending on a tag in the problem text (which every
// prompt quotes): "SUITE_MS=x" gives a kernel of x ms, "SUITE_WRONG" an
// incorrect one.
std::string TaggedKernel(const LlmRequest& r, int) {
  std::string marker = "FAKE_MS(1.0)";
  if (r.prompt.find("SUITE_WRONG") != std::string::npos) marker = "FAKE_STATUS(incorrect)";
  size_t at = r.prompt.find("SUITE_MS=");
  if (at != std::string::npos) {
    size_t end = r.prompt.find_first_not_of("0123456789.", at + 9);
    marker = "FAKE_MS(" + r.prompt.substr(at + 9, end - at - 9) + ")";
  }
  return FakeModel::KernelWithMarkers("k", marker);
}

class SuiteRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "level");
    Problem("1_fast", "# SUITE_MS=0.5");
    Problem("2_broken", "# BROKEN");
    Problem("3_wrong", "# SUITE_WRONG");
    Problem("10_slow", "# SUITE_MS=4.0");
    auto s = store::LineageStore::Open((dir_ / "lineage.db").string());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    auto p = PromptLibrary::LoadDefault();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    prompts_ = std::make_unique<PromptLibrary>(std::move(*p));
    config_.rounds = 1;
    config_.ideas = 1;
    config_.branches = 1;
    config_.beam = 1;
    config_.repair_attempts = 0;
    config_.model = "tagged";
    llm_.model_ = "tagged";
    llm_.ideas_ = [](const LlmRequest&, int) {
      return std::string("```json\n[{\"title\": \"tile\", \"idea\": \"tile the loop\"}]\n```\n");
    };
    llm_.implement_ = llm_.repair_ = TaggedKernel;
  }
  void Problem(const std::string& name, const std::string& tag) {
    ASSERT_TRUE(WriteFile((dir_ / "level" / (name + ".py")).string(),
                          tag + "\n" + ks::testing::kCopyProblemSource)
                    .ok());
  }
  SuiteRunner::Hooks Hooks() {
    SuiteRunner::Hooks h;
    h.signature = [this](const std::string& file) -> StatusOr<Signature> {
      std::lock_guard<std::mutex> lock(mu_);
      signature_calls_[fs::path(file).stem().string()]++;
      if (ReadFile(file)->find("# BROKEN") != std::string::npos)
        return InvalidArgument(file + ": forward raised RuntimeError: shapes do not match");
      return ks::testing::CopySignature(file, fs::path(file).stem().string());
    };
    h.evaluator = [this](const std::string& file) -> StatusOr<SearchEvaluator> {
      std::lock_guard<std::mutex> lock(mu_);
      evaluator_calls_[fs::path(file).stem().string()]++;
      SearchEvaluator made;
      made.evaluator = std::make_unique<ScriptedEvaluator>(
          ScriptedEvaluatorOptions{.eager_ms = 2.0, .compile_ms = 1.5, .floor_ms = 0.25});
      return made;
    };
    return h;
  }

  TempDir dir_{"ks_suite_run_", TempDir::OnFailure::kKeep};
  std::unique_ptr<store::LineageStore> store_;
  std::unique_ptr<PromptLibrary> prompts_;
  SearchConfig config_;
  FakeModel llm_;
  std::mutex mu_;
  std::map<std::string, int> signature_calls_, evaluator_calls_;
};

TEST_F(SuiteRunTest, OneRowPerProblemAndTheFigures) {
  auto files = ListProblemFiles({(dir_ / "level").string()});
  ASSERT_TRUE(files.ok());
  auto id = SuiteRunner::Create(store_.get(), *files, config_);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  std::vector<std::string> finished;
  SuiteRunner runner({.store = store_.get(), .llm = &llm_, .prompts = prompts_.get(), .hooks = Hooks()},
                     [&](const SuiteEvent& e) {
                       if (e.type == SuiteEvent::Type::kProblemFinished) finished.push_back(e.result.problem);
                     });
  auto report = runner.Run(*id);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->status, "finished");
  EXPECT_EQ(finished, (std::vector<std::string>{"1_fast", "2_broken", "3_wrong", "10_slow"}));
  ASSERT_EQ(report->rows.size(), 4u);
  const auto& fast = report->rows[0];
  EXPECT_EQ(fast.status, "correct");
  EXPECT_NEAR(*fast.speedup_eager, 4.0, 1e-9);
  EXPECT_NEAR(*fast.speedup_compile, 3.0, 1e-9);
  EXPECT_NEAR(*fast.fraction_of_floor, 0.5, 1e-9);
  EXPECT_TRUE(fast.search_id && fast.candidate_id);
  EXPECT_EQ(report->rows[1].status, "error");
  EXPECT_NE(report->rows[1].message.find("shapes do not match"), std::string::npos) << report->rows[1].message;
  EXPECT_FALSE(report->rows[1].search_id.has_value());
  EXPECT_EQ(report->rows[2].status, "no correct kernel");
  EXPECT_FALSE(report->rows[2].correct);
  EXPECT_EQ(report->rows[3].status, "correct");
  EXPECT_NEAR(*report->rows[3].speedup_eager, 0.5, 1e-9);

  const SuiteFigures& f = report->figures;
  EXPECT_EQ(f.problems, 4);
  EXPECT_EQ(f.correct, 2);
  EXPECT_DOUBLE_EQ(f.fast_eager[0], 0.5);
  EXPECT_DOUBLE_EQ(f.fast_eager[1], 0.25);
  EXPECT_DOUBLE_EQ(f.fast_eager[2], 0.25);
  EXPECT_DOUBLE_EQ(f.fast_compile[1], 0.25);
  EXPECT_NEAR(*f.geomean_eager, std::sqrt(4.0 * 0.5), 1e-9);
  EXPECT_NEAR(*f.geomean_compile, std::sqrt(3.0 * 0.375), 1e-9);

  // The table a user reads, and the same from the store alone.
  std::string table = RenderSuiteReport(*report);
  EXPECT_NE(table.find("1_fast"), std::string::npos) << table;
  EXPECT_NE(table.find("4.00x"), std::string::npos) << table;
  EXPECT_NE(table.find("50%"), std::string::npos) << table;
  EXPECT_NE(table.find("no correct kernel"), std::string::npos) << table;
  auto again = LoadSuiteReport(store_.get(), *id);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(SuiteReportToJson(*again), SuiteReportToJson(*report));
}

TEST_F(SuiteRunTest, CancelledSuiteResumesWithoutRepeatingFinishedProblems) {
  auto files = ListProblemFiles({(dir_ / "level").string()});
  ASSERT_TRUE(files.ok());
  auto id = SuiteRunner::Create(store_.get(), *files, config_);
  ASSERT_TRUE(id.ok());
  std::atomic<bool> cancel{false};
  {
    SuiteRunner runner({.store = store_.get(), .llm = &llm_, .prompts = prompts_.get(), .cancel = &cancel,
                        .hooks = Hooks()},
                       [&](const SuiteEvent& e) {
                         if (e.type == SuiteEvent::Type::kProblemFinished && e.index == 0) cancel = true;
                       });
    auto report = runner.Run(*id);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->status, "cancelled");
    EXPECT_EQ(report->rows[0].status, "correct");
    EXPECT_EQ(report->rows[1].status, "pending");
    EXPECT_EQ(report->rows[3].status, "pending");
  }
  int calls_before = llm_.calls();
  EXPECT_GT(calls_before, 0);
  cancel = false;
  std::vector<std::pair<std::string, bool>> finished;
  SuiteRunner runner({.store = store_.get(), .llm = &llm_, .prompts = prompts_.get(), .cancel = &cancel,
                      .hooks = Hooks()},
                     [&](const SuiteEvent& e) {
                       if (e.type == SuiteEvent::Type::kProblemFinished) finished.push_back({e.result.problem, e.skipped});
                     });
  auto report = runner.Run(*id);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->status, "finished");
  // The finished problem is reported, not searched again: one signature and one
  // evaluator for it over both runs.
  ASSERT_EQ(finished.size(), 4u);
  EXPECT_EQ(finished[0], std::make_pair(std::string("1_fast"), true));
  EXPECT_FALSE(finished[3].second);
  EXPECT_EQ(signature_calls_["1_fast"], 1);
  EXPECT_EQ(evaluator_calls_["1_fast"], 1);
  EXPECT_EQ(report->rows[3].status, "correct");
  EXPECT_EQ(report->figures.correct, 2);
  EXPECT_DOUBLE_EQ(report->figures.fast_eager[1], 0.25);
}

TEST(SuiteStoreTest, SuiteNeedsProblemsAndAValidConfig) {
  TempDir dir("ks_suite_store_");
  auto s = store::LineageStore::Open((dir / "l.db").string());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(SuiteRunner::Create(s->get(), {}, SearchConfig{}).status().code(), Code::kInvalidArgument);
  SearchConfig bad;
  bad.ideas = 0;
  EXPECT_EQ(SuiteRunner::Create(s->get(), {"a.py"}, bad).status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*s)->GetSuite(12345).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace ks
