// Issue 24 on a GPU: `kernelsearch search --implement agent` with a scripted
// command: agent against the real evaluator on a softmax problem. The agent
// compiles a broken draft (compile error), compiles the good one (resources and
// launches, nothing run), tests a draft that leaves the last
// column unwritten (incorrect), tests the fixed one (correct) and submits it.
// The practice sets and the judging sets differ (the same deterministic
// kernel shows other error figures on each), and the submitted kernel is
// judged by the ordinary evaluation. Skips without a GPU.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/evaluation.h"
#include "store/lineage_store.h"
#include "tests/evaluator/softmax_kernel.h"
#include "tests/test_paths.h"

namespace ks {
namespace {

namespace fs = std::filesystem;
using ks::testing::kSoftmax;
using json = nlohmann::json;


json Plan(const std::string& last) {
  return {{"launches",
           {{{"kernel", "softmax_rows"}, {"grid", {"x.shape[0]"}}, {"block", {256}},
             {"args", {"x", "out", "x.shape[1]", last}}}}}};
}

json Turn(const std::string& tool, const std::string& source, const json& plan) {
  return {{"text", ""}, {"tool_calls", {{{"id", "c_" + tool}, {"name", tool}, {"arguments", {{"source", source}, {"plan", plan}}}}}}};
}

// The largest relative norm among an evaluation's outputs.
double RelNorm(const std::string& evaluation_json) {
  auto e = EvaluationFromJson(json::parse(evaluation_json, nullptr, false));
  double worst = -1;
  if (e.ok())
    for (const auto& o : e->errors) worst = std::max(worst, o.rel_norm);
  return worst;
}

TEST(AgentGpuTest, ScriptedAgentOnPracticeSetsThenJudgedByTheOrdinaryEvaluation) {
  std::string why;
  if (!GpuAvailable(&why)) GTEST_SKIP() << "no GPU here: " << why;
  fs::path dir = fs::temp_directory_path() / ("ks_agent_gpu_test_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string db = (dir / "ks.db").string();
  const std::string problem = ks::testing::SourceDir() + "/tests/evaluator/gpu_fixtures/softmax_small.py";
  json turns = json::array({Turn("compile", std::string(kSoftmax) + "\nthis is not CUDA;\n", Plan("x.shape[1]")),
                            Turn("compile", kSoftmax, Plan("x.shape[1]")),
                            Turn("test", kSoftmax, Plan("x.shape[1] - 1")),
                            Turn("test", kSoftmax, Plan("x.shape[1]")),
                            Turn("submit", kSoftmax, Plan("x.shape[1]"))});
  ASSERT_TRUE(WriteFile((dir / "turns.json").string(), turns.dump()).ok());
  ASSERT_TRUE(WriteFile((dir / "agent.py").string(), R"PY(
import json, os, sys
req = json.load(sys.stdin)
here = os.path.dirname(os.path.abspath(__file__))
turn = sum(1 for m in req["messages"] if m["role"] == "assistant")
print(json.dumps(json.load(open(os.path.join(here, "turns.json")))[turn]))
)PY")
                  .ok());

  SubprocessOptions search;
  search.argv = {ks::testing::CliBinary(), "search", problem, "--model", "command:python3 " + (dir / "agent.py").string(),
                 "--implement", "agent", "--rounds", "0", "--branches", "1", "--repair", "0", "--profile-top", "0",
                 "--db", db, "--quiet"};
  search.timeout_s = 540;
  auto ran = RunSubprocess(search);
  ASSERT_TRUE(ran.ok()) << ran.status().ToString();
  ASSERT_TRUE(ran->Succeeded()) << ran->Describe() << "\nstdout: " << ran->out << "\nstderr: " << ran->err;

  auto store = store::LineageStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto attempts = (*store)->ListAttempts(1);
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 5u);
  EXPECT_EQ((*attempts)[0].status, "compile_error") << (*attempts)[0].result;
  // Compiled and resolved on the judging GPU's target, not run.
  EXPECT_EQ((*attempts)[1].status, "compiled") << (*attempts)[1].result;
  EXPECT_NE((*attempts)[1].result.find("registers/thread"), std::string::npos) << (*attempts)[1].result;
  EXPECT_NE((*attempts)[1].result.find("launch softmax_rows: grid"), std::string::npos) << (*attempts)[1].result;
  EXPECT_TRUE((*attempts)[1].evaluation_json.empty()) << "a compile runs nothing";
  EXPECT_EQ((*attempts)[2].status, "incorrect") << (*attempts)[2].result;
  // Error figures and positions only: no reference value reaches the model.
  EXPECT_EQ((*attempts)[2].result.find(", expected "), std::string::npos) << (*attempts)[2].result;
  EXPECT_NE((*attempts)[2].result.find("first at index"), std::string::npos) << (*attempts)[2].result;
  EXPECT_EQ((*attempts)[3].status, "correct") << (*attempts)[3].result;
  EXPECT_EQ((*attempts)[4].tool, "submit");
  std::printf("agent tool results:\n--- compile (bad) ---\n%s\n--- compile ---\n%s\n--- test (bug) ---\n%s\n"
              "--- test (fixed) ---\n%s\n",
              (*attempts)[0].result.substr(0, 600).c_str(), (*attempts)[1].result.c_str(),
              (*attempts)[2].result.c_str(), (*attempts)[3].result.c_str());

  auto cands = (*store)->ListCandidates(1);
  ASSERT_TRUE(cands.ok());
  ASSERT_EQ(cands->size(), 1u);
  const auto& judged = (*cands)[0];
  ASSERT_TRUE(judged.evaluation.has_value());
  EXPECT_EQ(judged.evaluation->status, EvalStatus::kCorrect) << judged.evaluation->evaluation_json.substr(0, 2000);
  // The same deterministic kernel on other input sets: other error figures.
  double practice = RelNorm((*attempts)[3].evaluation_json), judging = RelNorm(judged.evaluation->evaluation_json);
  std::printf("relative norm: practice %.6g, judging %.6g; judged %.4f ms, %.2fx eager\n", practice, judging,
              judged.evaluation->median_ms.value_or(0), judged.evaluation->speedup_eager.value_or(0));
  EXPECT_GT(practice, 0);
  EXPECT_GT(judging, 0);
  EXPECT_NE(practice, judging) << "practice and judging sets look identical";

  SubprocessOptions show;
  show.argv = {ks::testing::CliBinary(), "show", std::to_string(judged.id), "--db", db};
  auto shown = RunSubprocess(show);
  ASSERT_TRUE(shown.ok());
  EXPECT_NE(shown->out.find("correct on practice sets, correct when judged"), std::string::npos) << shown->out;
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace ks
