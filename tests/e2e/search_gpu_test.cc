// Issue 6 on a GPU: a real 2-round search (round 0 and one improvement round) on
// a softmax problem, with the model replayed from a recorded transcript holding
// real kernels (tests/e2e/fixtures/softmax_search.jsonl), through the real
// binary and the real evaluator. It must end with a correct kernel faster than
// PyTorch eager, and `export` of that kernel must run in PyTorch and match the
// reference. Skips without a GPU.
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/problem.h"
#include "store/lineage_store.h"
#include "tests/testing/paths.h"
#include "tests/testing/skip.h"
#include "tests/testing/temp_dir.h"
#include "tests/search/export_check.h"

namespace ks {
namespace {

namespace fs = std::filesystem;

TEST(SearchGpuTest, TwoRoundSoftmaxSearchBeatsEagerAndItsExportMatches) {
  KS_REQUIRE_GPU();
  ks::testing::TempDir dir("ks_search_gpu_test_", ks::testing::TempDir::OnFailure::kKeep);
  const std::string db = (dir / "ks.db").string();
  const std::string problem = ks::testing::SourceDir() + "/tests/evaluator/gpu_fixtures/softmax_small.py";
  const std::string transcript = ks::testing::SourceDir() + "/tests/e2e/fixtures/softmax_search.jsonl";

  SubprocessOptions search;
  search.argv = {ks::testing::CliBinary(), "search", problem, "--model", "replay:" + transcript, "--replay-loose",
                 "--rounds", "1", "--ideas", "2", "--branches", "2", "--beam", "1", "--repair", "0",
                 "--db", db, "--quiet"};
  search.timeout_s = 540;
  auto ran = RunSubprocess(search);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  ASSERT_TRUE(ran->Succeeded()) << ran->Describe() << "\nstdout: " << ran->out << "\nstderr: " << ran->err;

  auto store = store::LineageStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto history = (*store)->History(0);
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), 1u);
  int64_t search_id = (*history)[0].search.id;
  auto all = (*store)->ListCandidates(search_id);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  int incorrect = 0;
  for (const auto& c : *all) {
    std::string status = c.evaluation ? EvalStatusName(c.evaluation->status) : "pending";
    std::printf("candidate %lld round %d: %s %.4f ms\n", static_cast<long long>(c.id), c.round, status.c_str(),
                c.evaluation ? c.evaluation->median_ms.value_or(0) : 0.0);
    if (c.evaluation && c.evaluation->status == EvalStatus::kIncorrect) ++incorrect;
  }
  EXPECT_GE(incorrect, 1) << "the transcript's off-by-one kernel must be caught";
  auto best = (*store)->BestCorrect(search_id);
  ASSERT_TRUE(best.ok()) << best.status().ToString();
  ASSERT_TRUE(best->has_value()) << "no correct kernel; search stderr:\n" << ran->err;
  const store::CandidateRow& b = **best;
  ASSERT_TRUE(b.evaluation.has_value());
  EXPECT_EQ(b.evaluation->status, EvalStatus::kCorrect);
  ASSERT_TRUE(b.evaluation->speedup_eager.has_value());
  std::printf("best kernel #%lld (round %d): median %.4f ms, %.2fx eager, %s x torch.compile\n",
              static_cast<long long>(b.id), b.round, b.evaluation->median_ms.value_or(0), *b.evaluation->speedup_eager,
              b.evaluation->speedup_compile ? std::to_string(*b.evaluation->speedup_compile).c_str() : "n/a");
  EXPECT_GT(*b.evaluation->speedup_eager, 1.0);
  EXPECT_EQ(b.round, 1) << "the improvement round should win: it reads x once instead of three times";

  const std::string out = (dir / "export").string();
  SubprocessOptions ex;
  ex.argv = {ks::testing::CliBinary(), "export", std::to_string(b.id), "--db", db, "--out", out};
  ex.timeout_s = 180;
  auto exported = RunSubprocess(ex);
  ASSERT_TRUE(exported.ok());
  ASSERT_TRUE(exported->Succeeded()) << exported->Describe() << "\n" << exported->err;
  auto python = ResolvePython();
  ASSERT_TRUE(python.ok()) << python.status().ToString();
  SubprocessOptions check;
  check.argv = {python->python, testing::ExportCheckScript(), out, "[[2048, 4096]]", "1e-4", "1e-4"};
  check.timeout_s = 300;
  auto r = RunSubprocess(check);
  ASSERT_TRUE(r.ok());
  std::printf("%s", r->out.c_str());
  ASSERT_TRUE(r->Succeeded()) << r->Describe() << "\n" << r->err;
  EXPECT_NE(r->out.find("EXPORT_MATCHES"), std::string::npos) << r->out;
}

}  // namespace
}  // namespace ks
