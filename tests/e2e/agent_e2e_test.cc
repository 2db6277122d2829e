// The real `kernelsearch search --implement agent` with a command: agent (the
// conversation protocol of llm/conversation.h) and the fake evaluator: kill -9
// in the middle of the conversation, then --resume repeats no model call
// (counted by the agent script itself); `show`, `lineage` and `history` show
// the attempts.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/signature.h"
#include "store/lineage_store.h"
#include "tests/testing/copy_problem.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using json = nlohmann::json;
const std::string kBinary = ks::testing::CliBinary();

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

std::string Src(const std::string& marker) {
  return "extern \"C\" __global__ void k(float* out, const float* x, int n) { /* " + marker +
         " */ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i]; }";
}

json Turn(const std::vector<std::pair<std::string, std::string>>& calls) {
  json plan = {{"launches",
                {{{"kernel", "k"}, {"grid", {"cdiv(x.numel, 256)"}}, {"block", {256}}, {"args", {"out", "x", "x.numel"}}}}}};
  json tc = json::array();
  for (const auto& [tool, marker] : calls)
    tc.push_back({{"id", "c" + std::to_string(tc.size())}, {"name", tool},
                  {"arguments", {{"source", Src(marker)}, {"plan", plan}}}});
  return {{"text", ""}, {"tool_calls", tc}};
}

class AgentE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    copy_ = ks::testing::WriteCopyProblem(dir_.path());
    json turns = json::array({Turn({{"compile", "FAKE_STATUS(compile_error)"}}),
                              Turn({{"compile", "fixed"}, {"test", "FAKE_STATUS(incorrect)"}}),
                              Turn({{"test", "FAKE_MS(0.5)"}}), Turn({{"submit", "FAKE_MS(0.5)"}})});
    ASSERT_TRUE(WriteFile(Path("turns.json"), turns.dump()).ok());
    // Answers turn n of the conversation and logs n: the count of paid calls.
    ASSERT_TRUE(WriteFile(Path("agent.py"), R"PY(
import json, os, sys
req = json.load(sys.stdin)
here = os.path.dirname(os.path.abspath(__file__))
turn = sum(1 for m in req["messages"] if m["role"] == "assistant")
with open(os.path.join(here, "calls.log"), "a") as f:
    f.write("%d\n" % turn)
print(json.dumps(json.load(open(os.path.join(here, "turns.json")))[turn]))
)PY")
                    .ok());
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  SubprocessResult Run(std::vector<std::string> argv) {
    SubprocessOptions o;
    o.argv = std::move(argv);
    o.timeout_s = 300;
    auto r = RunSubprocess(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }

  ks::testing::TempDir dir_{"ks_agent_e2e_", ks::testing::TempDir::OnFailure::kKeep};
  ks::testing::CopyProblem copy_;
};

TEST_F(AgentE2eTest, KillNineMidConversationThenResumeRepeatsNoModelCall) {
  const std::string db = Path("agent.db"), log = Path("evals.log");
  // Slow practice evaluations, so that the kill lands inside turn 1's tool calls.
  ASSERT_TRUE(WriteFile(Path("eval.json"), json{{"log", log}, {"delay_ms", 400}}.dump()).ok());
  std::vector<std::string> args = {kBinary, "search", copy_.file, "--db", db, "--signature", copy_.signature,
                                   "--model", "command:python3 " + Path("agent.py"), "--rounds", "0",
                                   "--branches", "1", "--repair", "0", "--profile-top", "0",
                                   "--implement", "agent", "--evaluator", "fake:" + Path("eval.json"),
                                   "--gpu", "Fake GPU 1", "--quiet"};
  auto child = ChildProcess::Start(args, {}, Path("killed.stderr"));
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  // Two practice evaluations done: turn 1's reply is stored, its test runs.
  while (ReadLines(log).size() < 2) {
    auto ended = child->TryReap();
    ASSERT_FALSE(ended.has_value()) << "ended before the kill: " << *ReadFile(Path("killed.stderr"));
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string how = child->Kill();
  EXPECT_NE(how.find("signal 9"), std::string::npos) << how;
  EXPECT_EQ(ReadLines(Path("calls.log")), (std::vector<std::string>{"0", "1"}));

  SubprocessResult resumed =
      Run({kBinary, "search", "--resume", "1", "--db", db, "--evaluator", "fake:" + Path("eval.json"), "--quiet"});
  ASSERT_TRUE(resumed.Succeeded()) << resumed.Describe() << "\n" << resumed.err;
  // Every turn was paid for once: the kill and the resume repeated none.
  EXPECT_EQ(ReadLines(Path("calls.log")), (std::vector<std::string>{"0", "1", "2", "3"}));

  auto store = store::LineageStore::Open(db);
  ASSERT_TRUE(store.ok());
  auto cands = *(*store)->ListCandidates(1);
  ASSERT_EQ(cands.size(), 1u);
  ASSERT_TRUE(cands[0].evaluation.has_value());
  EXPECT_EQ(cands[0].evaluation->status, EvalStatus::kCorrect);
  EXPECT_EQ((*store)->ListAttempts(1)->size(), 5u);

  SubprocessResult show = Run({kBinary, "show", std::to_string(cands[0].id), "--db", db});
  EXPECT_NE(show.out.find("agent:   5 tool calls"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("turn 0 compile  compile_error"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("correct on practice sets, correct when judged"), std::string::npos) << show.out;
  SubprocessResult lineage = Run({kBinary, "lineage", std::to_string(cands[0].id), "--db", db});
  EXPECT_NE(lineage.out.find("|- turn 3 submit"), std::string::npos) << lineage.out;
  SubprocessResult report = Run({kBinary, "report", "1", "--db", db, "--json"});
  json rj = json::parse(report.out, nullptr, false);
  ASSERT_TRUE(rj.is_object() && rj.contains("candidates")) << report.out.substr(0, 500);
  ASSERT_EQ(rj["candidates"].size(), 1u);
  EXPECT_EQ(rj["candidates"][0]["agent"]["attempts"].size(), 5u);
  EXPECT_FALSE(rj["candidates"][0]["agent"]["practice_disagrees"].get<bool>());
  SubprocessResult history = Run({kBinary, "history", "--db", db, "--json"});
  json h = json::parse(history.out, nullptr, false);
  ASSERT_TRUE(h.is_array() && h.size() == 1) << history.out;
  EXPECT_EQ(h[0].value("tool_calls", 0), 5);
  EXPECT_EQ(h[0].value("practice_evaluations", 0), 2);  // test x2 (compile runs nothing)
}

TEST_F(AgentE2eTest, GenerateOnlyRefusesAnAgentSearchSayingWhy) {
  SubprocessResult r = Run({kBinary, "search", copy_.file, "--db", Path("split.db"), "--signature",
                            copy_.signature, "--model", "command:python3 " + Path("agent.py"), "--rounds", "0",
                            "--implement", "agent", "--generate-only", "--gpu", "Fake GPU 1", "--quiet"});
  EXPECT_FALSE(r.Succeeded());
  EXPECT_NE(r.err.find("need the GPU side"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kernelsearch serve --evaluator workers"), std::string::npos) << r.err;  // the route that can
}

}  // namespace
}  // namespace ks
