// The agent through the server and GPU workers (issue 32), end to end: the
// real `kernelsearch serve --evaluator workers` runs an agent search (a
// command: model that answers the ideas prompt and then the conversation's
// turns from a script) whose compile, test and profile calls are served by a
// real `kernelsearch gpu-worker` with the scripted evaluator; a worker killed
// with SIGKILL in the middle of a test call loses nothing: the call's short
// lease expires, another worker runs it, the conversation goes on without a
// repeated model call and the submitted candidate is judged.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/subprocess.h"
#include "evaluator/profile/counters.h"
#include "store/lineage_store.h"
#include "server/client.h"
#include "tests/e2e/server_harness.h"
#include "tests/testing/paths.h"

namespace ks::e2e {
namespace {

namespace pb = ::kernelsearch::v1;
using json = nlohmann::json;
using namespace std::chrono_literals;

// Answers the ideas prompt with one idea, and turn n of the agent's
// conversation with turns.json[n]; logs each turn and the tools offered.
constexpr char kAgentModel[] = R"PY(
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
data = sys.stdin.read()
if os.environ.get("KS_LLM_PROTOCOL") != "ks-conversation-1":
    print('```json\n[{"title": "copy", "idea": "one thread per element"}]\n```')
    sys.exit(0)
req = json.loads(data)
turn = sum(1 for m in req["messages"] if m["role"] == "assistant")
with open(os.path.join(here, "turns.log"), "a") as f:
    f.write("%d %s\n" % (turn, ",".join(t["name"] for t in req.get("tools", []))))
print(json.dumps(json.load(open(os.path.join(here, "turns.json")))[turn]))
)PY";

std::string Src(const std::string& marker) {
  return "extern \"C\" __global__ void k(float* out, const float* x, int n) { /* " + marker +
         " */ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i]; }";
}

json Turn(const std::string& tool, const std::string& marker) {
  json plan = {{"launches",
                {{{"kernel", "k"}, {"grid", {"cdiv(x.numel, 256)"}}, {"block", {256}}, {"args", {"out", "x", "x.numel"}}}}}};
  return {{"text", ""},
          {"tool_calls", json::array({{{"id", "c0"}, {"name", tool}, {"arguments", {{"source", Src(marker)}, {"plan", plan}}}}})}};
}

std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

class AgentWorkersE2eTest : public ::testing::Test {
 protected:
  // The harness's server with the agent's model; the scripted evaluator's
  // config (for the workers) and the conversation's turns.
  void SetUpServer(const json& evaluator, const std::vector<json>& turns) {
    h_ = std::make_unique<ServerHarness>(HarnessOptions{.evaluator = "workers"});
    ASSERT_TRUE(WriteFile(h_->Path("agent.py"), kAgentModel).ok());
    ASSERT_TRUE(WriteFile(h_->Path("model.sh"), "#!/bin/sh\nexec python3 " + h_->Path("agent.py") + "\n").ok());
    std::filesystem::permissions(h_->Path("model.sh"), std::filesystem::perms::owner_all);
    ASSERT_TRUE(WriteFile(h_->Path("turns.json"), json(turns).dump()).ok());
    ASSERT_TRUE(WriteFile(h_->Path("evaluator.json"), evaluator.dump()).ok());
    h_->Start();
    problem_ = h_->SeedProblem();
    client_ = h_->Connect();
  }

  std::string StartAgentSearch() {
    pb::StartSearchRequest req;
    req.set_problem_id(std::to_string(problem_));
    pb::SearchConfig* c = req.mutable_config();
    c->set_rounds(1);
    c->set_target_speedup(2);  // round 0's kernel (4x eager) ends the search: one conversation
    c->set_ideas_per_round(1);
    c->set_branches(1);
    c->set_beam(1);
    c->set_repair_attempts(0);
    c->set_implement("agent");
    c->set_agent_turns(6);
    c->set_agent_tool_calls(8);
    auto started = client_->StartSearch(req);
    EXPECT_TRUE(started.ok()) << started.status().ToString() << h_->Log();
    return started.ok() ? started->search_id() : "";
  }

  ChildProcess StartWorker(const std::string& name, double lease_s) {
    std::vector<std::string> argv = {ks::testing::CliBinary(), "gpu-worker", "--server", h_->address(), "--token-file",
                                     h_->Path("token"), "--evaluator", "fake:" + h_->Path("evaluator.json"),
                                     "--gpus", "0", "--name", name, "--lease-seconds", std::to_string(lease_s),
                                     "--poll", "0.2"};
    auto child = ChildProcess::Start(argv, {}, h_->Path(name + ".log"));
    EXPECT_TRUE(child.ok()) << child.status().ToString();
    return std::move(child).value();
  }

  pb::SearchInfo WaitFinished(const std::string& id, std::chrono::seconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    pb::GetSearchRequest req;
    req.set_search_id(id);
    pb::SearchInfo info;
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = client_->GetSearch(req);
      if (r.ok()) {
        info = *r;
        if (info.state() != pb::QUEUED && info.state() != pb::RUNNING) return info;
      }
      std::this_thread::sleep_for(100ms);
    }
    return info;
  }

  // Waits until the server log has `needle`; false after `limit`.
  bool WaitForLog(const std::string& needle, std::chrono::seconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (h_->Log().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  static std::string StopWorker(ChildProcess& w) {
    ::kill(w.pid(), SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto how = w.TryReap()) return *how;
      std::this_thread::sleep_for(50ms);
    }
    return "still running";
  }

  std::unique_ptr<ServerHarness> h_;
  int64_t problem_ = 0;
  std::unique_ptr<server::Client> client_;
};

TEST_F(AgentWorkersE2eTest, TheAgentRunsOnTheServerAndItsToolCallsOnTheWorker) {
  LaunchCounters l;
  l.kernel = "k";
  l.dram_pct = 61;
  json evaluator = {{"counters", CounterReportToJson(CounterReport{{l}, "", 0.5})}};
  SetUpServer(evaluator, {Turn("compile", "FAKE_STATUS(compile_error)"), Turn("test", "FAKE_MS(0.5)"),
                          Turn("profile", "FAKE_MS(0.5)"), Turn("submit", "FAKE_MS(0.5)")});
  ChildProcess worker = StartWorker("w", 60);
  // The worker has asked for work (and said its evaluator reads counters)
  // before the agent's tools are chosen: `profile` is offered.
  std::this_thread::sleep_for(1500ms);
  const std::string id = StartAgentSearch();
  ASSERT_FALSE(id.empty());
  pb::SearchInfo fin = WaitFinished(id, 120s);
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h_->Log();
  EXPECT_EQ(StopWorker(worker), "exit code 0");

  // Every model turn once, with the profile tool offered.
  std::vector<std::string> turns = Lines(h_->Path("turns.log"));
  ASSERT_EQ(turns.size(), 4u) << h_->Log();
  EXPECT_EQ(turns[0], "0 compile,test,profile,submit");
  // The tool calls were leased to the worker and answered by it.
  const std::string log = h_->Log();
  EXPECT_NE(log.find("leased practice call(s) 1(compile) to w/gpu0"), std::string::npos) << log;
  EXPECT_NE(log.find("leased practice call(s) 2(test) to w/gpu0"), std::string::npos) << log;
  EXPECT_NE(log.find("leased practice call(s) 3(profile) to w/gpu0"), std::string::npos) << log;
  auto worker_log = ReadFile(h_->Path("w.log"));
  ASSERT_TRUE(worker_log.ok());
  EXPECT_NE(worker_log->find("practice calls 3"), std::string::npos) << *worker_log;

  auto store = store::LineageStore::Open(h_->db());
  ASSERT_TRUE(store.ok());
  const int64_t search = std::stoll(id);
  for (int64_t call = 1; call <= 3; ++call) {
    auto row = (*store)->GetPracticeCall(call);
    ASSERT_TRUE(row.ok()) << row.status().ToString();
    EXPECT_EQ(row->search_id, search);
    EXPECT_EQ(row->state, store::PracticeCallState::kDone);
    EXPECT_EQ(row->worker, "w/gpu0");
    EXPECT_EQ(row->attempts, 1);
  }
  // What the model was told, from the worker's results; the submission judged.
  auto attempts = (*store)->ListAttempts(search);
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 4u);
  EXPECT_EQ((*attempts)[0].status, "compile_error");
  EXPECT_EQ((*attempts)[1].status, "correct");
  EXPECT_EQ((*attempts)[2].status, "profiled");
  EXPECT_NE((*attempts)[2].result.find("hardware counters"), std::string::npos) << (*attempts)[2].result;
  EXPECT_EQ((*attempts)[3].tool, "submit");
  auto cands = (*store)->ListCandidates(search);
  ASSERT_TRUE(cands.ok());
  ASSERT_EQ(cands->size(), 1u);
  ASSERT_TRUE((*cands)[0].evaluation.has_value()) << h_->Log();
  EXPECT_EQ((*cands)[0].evaluation->status, EvalStatus::kCorrect);
  EXPECT_NE(log.find("leased candidate(s) " + std::to_string((*cands)[0].id) + " to w/gpu0"), std::string::npos);
}

TEST_F(AgentWorkersE2eTest, AWorkerKilledMidCallLosesNothing) {
  // Slow evaluations, so that the kill lands inside the test call.
  SetUpServer({{"delay_ms", 2000}}, {Turn("test", "FAKE_MS(0.5)"), Turn("submit", "FAKE_MS(0.5)")});
  ChildProcess doomed = StartWorker("doomed", 3);  // practice leases: 3 s (under the server's 15)
  const std::string id = StartAgentSearch();
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitForLog("leased practice call(s) 1(test) to doomed/gpu0", 60s)) << h_->Log();
  std::this_thread::sleep_for(300ms);
  std::string how = doomed.Kill();
  EXPECT_NE(how.find("signal 9"), std::string::npos) << how;

  ChildProcess survivor = StartWorker("survivor", 3);
  pb::SearchInfo fin = WaitFinished(id, 120s);
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h_->Log();
  EXPECT_EQ(StopWorker(survivor), "exit code 0");

  // The call's lease expired and the survivor ran it (a second attempt).
  const std::string log = h_->Log();
  EXPECT_NE(log.find("leased practice call(s) 1(test, attempt 2) to survivor/gpu0"), std::string::npos) << log;
  auto store = store::LineageStore::Open(h_->db());
  ASSERT_TRUE(store.ok());
  auto call = (*store)->GetPracticeCall(1);
  ASSERT_TRUE(call.ok());
  EXPECT_EQ(call->state, store::PracticeCallState::kDone);
  EXPECT_EQ(call->worker, "survivor/gpu0");
  EXPECT_EQ(call->attempts, 2);
  // The conversation went on without a repeated model turn; the test answered, the submission judged.
  EXPECT_EQ(Lines(h_->Path("turns.log")).size(), 2u);
  const int64_t search = std::stoll(id);
  auto attempts = (*store)->ListAttempts(search);
  ASSERT_TRUE(attempts.ok());
  ASSERT_EQ(attempts->size(), 2u);
  EXPECT_EQ((*attempts)[0].status, "correct");
  EXPECT_FALSE((*attempts)[0].is_error);
  auto cands = (*store)->ListCandidates(search);
  ASSERT_TRUE(cands.ok());
  ASSERT_EQ(cands->size(), 1u);
  ASSERT_TRUE((*cands)[0].evaluation.has_value());
  EXPECT_EQ((*cands)[0].evaluation->status, EvalStatus::kCorrect);
}

TEST_F(AgentWorkersE2eTest, AServerStoppedWhileACallWaitsResumesTheConversation) {
  SetUpServer(json::object(), {Turn("test", "FAKE_MS(0.5)"), Turn("submit", "FAKE_MS(0.5)")});
  const std::string id = StartAgentSearch();  // no worker yet: the test call waits
  ASSERT_FALSE(id.empty());
  auto store = store::LineageStore::Open(h_->db());
  ASSERT_TRUE(store.ok());
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!(*store)->GetPracticeCall(1).ok() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  ASSERT_TRUE((*store)->GetPracticeCall(1).ok()) << h_->Log();
  // SIGTERM: the waiting call is dropped at once and the search left to resume.
  EXPECT_EQ(h_->Terminate(), "exit code 0") << h_->Log();
  EXPECT_EQ((*store)->GetSearch(std::stoll(id))->status, store::SearchStatus::kPending) << h_->Log();
  EXPECT_EQ((*store)->GetPracticeCall(1)->state, store::PracticeCallState::kAbandoned);

  h_->Start();
  client_ = h_->Connect();
  ChildProcess worker = StartWorker("w", 60);
  pb::SearchInfo fin = WaitFinished(id, 120s);
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h_->Log();
  EXPECT_EQ(StopWorker(worker), "exit code 0");
  // Turn 0 was paid for once: the resumed agent found it stored and ran its call again.
  EXPECT_EQ(Lines(h_->Path("turns.log")), (std::vector<std::string>{"0 compile,test,submit", "1 compile,test,submit"}));
  auto again = (*store)->GetPracticeCall(2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->state, store::PracticeCallState::kDone);
  auto cands = (*store)->ListCandidates(std::stoll(id));
  ASSERT_TRUE(cands.ok());
  ASSERT_EQ(cands->size(), 1u);
  ASSERT_TRUE((*cands)[0].evaluation.has_value());
  EXPECT_EQ((*cands)[0].evaluation->status, EvalStatus::kCorrect);
}

}  // namespace
}  // namespace ks::e2e
