// The agent mode of the implement step (search/agent.h) through the real
// orchestrator and store, with the scripted evaluator as both the practice and
// the judging evaluator, against each model dialect: OpenAI tools and
// Anthropic tool_use on loopback fake servers, and the command: protocol.
// One scripted agent: compile -> compile error -> fix -> test -> wrong ->
// malformed calls (answered as tool errors) -> test -> correct -> submit.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "llm/llm_factory.h"
#include "search/agent.h"
#include "search/orchestrator.h"
#include "search/scripted_evaluator.h"
#include "tests/llm/fake_llm_server.h"
#include "tests/testing/copy_problem.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using json = nlohmann::json;
using store::LineageStore;
using store::SearchStatus;

std::string Src(const std::string& marker) {
  return "extern \"C\" __global__ void k(float* out, const float* x, int n) { /* " + marker +
         " */ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i]; }";
}
json Plan() {
  return {{"launches",
           {{{"kernel", "k"}, {"grid", {"cdiv(x.numel, 256)"}}, {"block", {256}}, {"args", {"out", "x", "x.numel"}}}}}};
}
json Args(const std::string& marker) { return {{"source", Src(marker)}, {"plan", Plan()}}; }

struct Call {
  std::string name;
  json arguments;
};
// The agent's turns, each a list of tool calls.
std::vector<std::vector<Call>> Script() {
  return {
      {{"compile", Args("FAKE_STATUS(compile_error)")}},
      {{"compile", Args("fixed FAKE_MS(0.9)")}, {"test", Args("FAKE_STATUS(incorrect)")}},
      {{"frobnicate", json::object()}, {"test", {{"source", Src("no plan")}}}},
      {{"test", Args("FAKE_MS(0.5)")}},
      {{"submit", Args("FAKE_MS(0.5)")}},
  };
}
// What each tool call is stored with, in order.
const std::vector<std::string> kStatuses = {"compile_error", "compiled",   "incorrect", "tool_error",
                                            "tool_error",    "correct",    ""};

std::string OpenAiTurn(int turn, const std::vector<Call>& calls) {
  json tc = json::array();
  for (size_t i = 0; i < calls.size(); ++i)
    tc.push_back({{"id", "call_" + std::to_string(turn) + "_" + std::to_string(i)},
                  {"type", "function"},
                  {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments.dump()}}}});
  return json{{"choices", {{{"index", 0},
                            {"message", {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", tc}}},
                            {"finish_reason", "tool_calls"}}}},
              {"usage", {{"prompt_tokens", 100}, {"completion_tokens", 20}}}}
      .dump();
}

std::string AnthropicTurn(int turn, const std::vector<Call>& calls) {
  json content = json::array({{{"type", "text"}, {"text", "Let me check."}}});
  for (size_t i = 0; i < calls.size(); ++i)
    content.push_back({{"type", "tool_use"},
                       {"id", "toolu_" + std::to_string(turn) + "_" + std::to_string(i)},
                       {"name", calls[i].name},
                       {"input", calls[i].arguments}});
  return json{{"content", content}, {"stop_reason", "tool_use"}, {"usage", {{"input_tokens", 90}, {"output_tokens", 30}}}}
      .dump();
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto lib = PromptLibrary::Load(ks::testing::SourcePath("prompts"));
    ASSERT_TRUE(lib.ok()) << lib.status().ToString();
    prompts_ = std::move(lib).value();
    auto s = LineageStore::Open((dir_ / "agent.db").string());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }
  int64_t NewSearch(const SearchConfig& c) {
    auto id = Orchestrator::CreateSearch(store_.get(), "copy.py", "class Model: pass\n", ks::testing::CopySignature(), c);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return *id;
  }

  static SearchConfig AgentConfig(const std::string& model) {
    SearchConfig c;
    c.rounds = 0;  // round 0 only: one idea ("straightforward"), one implementation
    c.branches = 1;
    c.repair_attempts = 0;
    c.profile_top = 0;
    c.model = model;
    c.implement = ImplementMode::kAgent;
    return c;
  }

  std::unique_ptr<LlmClient> Client(const std::string& spec) {
    LlmConfig config;
    config.spec = spec;
    config.max_retries = 0;
    auto client = MakeLlmClient(config);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return std::move(client).value();
  }

  StatusOr<SearchOutcome> RunSearch(int64_t id, LlmClient* llm, Orchestrator** orch_out = nullptr) {
    Orchestrator orch({.store = store_.get(), .llm = llm, .evaluator = judge_.get(), .prompts = &prompts_,
                       .practice_evaluator = practice_.get()},
                      nullptr);
    if (orch_out) *orch_out = &orch;
    return orch.Run(id);
  }

  // The lineage holds every step, and the submitted candidate was judged by
  // the ordinary evaluation.
  void ExpectScriptedAgentLineage(int64_t id) {
    auto attempts = *store_->ListAttempts(id);
    ASSERT_EQ(attempts.size(), kStatuses.size());
    for (size_t i = 0; i < attempts.size(); ++i) EXPECT_EQ(attempts[i].status, kStatuses[i]) << i;
    EXPECT_NE(attempts[0].result.find("compile error"), std::string::npos) << attempts[0].result;
    EXPECT_NE(attempts[3].result.find("unknown tool 'frobnicate'"), std::string::npos) << attempts[3].result;
    EXPECT_NE(attempts[4].result.find("missing \"plan\""), std::string::npos) << attempts[4].result;
    EXPECT_NE(attempts[2].result.find("practice input sets"), std::string::npos) << attempts[2].result;
    EXPECT_EQ(attempts.back().tool, "submit");
    auto counts = *store_->CountAttempts(id);
    EXPECT_EQ(counts.tool_calls, 7);
    EXPECT_EQ(counts.tool_errors, 2);
    EXPECT_EQ(counts.tests, 2);  // the two tests that ran; compiles run nothing
    EXPECT_EQ(counts.submitted, 1);
    auto cands = *store_->ListCandidates(id);
    ASSERT_EQ(cands.size(), 1u);
    EXPECT_EQ(cands[0].source, Src("FAKE_MS(0.5)"));
    EXPECT_EQ(cands[0].slot_key, attempts[0].slot_key);
    ASSERT_TRUE(cands[0].evaluation.has_value());
    EXPECT_EQ(cands[0].evaluation->status, EvalStatus::kCorrect);
    EXPECT_EQ(practice_->evaluated(), 4);  // compile x2, test x2: practice sets only
    EXPECT_EQ(judge_->evaluated(), 1);     // the submitted candidate, judged once
  }

  ks::testing::TempDir dir_{"ks_agent_test_"};
  PromptLibrary prompts_;
  std::unique_ptr<LineageStore> store_;
  std::unique_ptr<ScriptedEvaluator> judge_ = std::make_unique<ScriptedEvaluator>(ScriptedEvaluatorOptions{});
  std::unique_ptr<ScriptedEvaluator> practice_ = std::make_unique<ScriptedEvaluator>(ScriptedEvaluatorOptions{});
};

TEST_F(AgentTest, OpenAiToolsScriptedAgentCompilesTestsFixesAndSubmits) {
  testing::FakeLlmServer server;
  std::vector<testing::FakeReply> replies;
  auto script = Script();
  for (size_t t = 0; t < script.size(); ++t) replies.push_back({200, OpenAiTurn(t, script[t])});
  server.Script(replies);
  auto llm = Client("openai:gpt-test@" + server.openai_base());
  int64_t id = NewSearch(AgentConfig("openai:gpt-test@" + server.openai_base()));
  auto out = RunSearch(id, llm.get());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status, SearchStatus::kFinished);
  ExpectScriptedAgentLineage(id);
  auto seen = server.seen();
  ASSERT_EQ(seen.size(), 5u);
  // The dialect: tools offered as functions; results as `tool` messages answering their call ids.
  json first = json::parse(seen[0].body);
  ASSERT_EQ(first["tools"].size(), 3u);
  EXPECT_EQ(first["tools"][0]["type"], "function");
  json third = json::parse(seen[2].body);
  bool answered = false;
  for (const auto& m : third["messages"])
    if (m["role"] == "tool" && m["tool_call_id"] == "call_0_0") {
      answered = true;
      EXPECT_NE(m["content"].get<std::string>().find("compile error"), std::string::npos);
    }
  EXPECT_TRUE(answered) << third.dump();
  json last = json::parse(seen[4].body);
  int replayed = 0;  // the model's own malformed call goes back as it sent it
  for (const auto& m : last["messages"])
    if (m["role"] == "assistant" && m["tool_calls"][0]["function"]["name"] == "frobnicate") ++replayed;
  EXPECT_EQ(replayed, 1);
}

TEST_F(AgentTest, AnthropicToolUseScriptedAgentCompilesTestsFixesAndSubmits) {
  testing::FakeLlmServer server;
  std::vector<testing::FakeReply> replies;
  auto script = Script();
  for (size_t t = 0; t < script.size(); ++t) replies.push_back({200, AnthropicTurn(t, script[t])});
  server.Script(replies);
  ::setenv("KS_AGENT_TEST_KEY", "k", 1);
  LlmConfig config;
  config.spec = "anthropic:claude-test@" + server.base();
  config.api_key_env = "KS_AGENT_TEST_KEY";
  config.max_retries = 0;
  auto llm = MakeLlmClient(config);
  ASSERT_TRUE(llm.ok()) << llm.status().ToString();
  int64_t id = NewSearch(AgentConfig(config.spec));
  auto out = RunSearch(id, llm->get());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectScriptedAgentLineage(id);
  auto seen = server.seen();
  ASSERT_EQ(seen.size(), 5u);
  json fourth = json::parse(seen[3].body);
  EXPECT_EQ(fourth["tools"][0]["name"], "compile");
  ASSERT_TRUE(fourth["tools"][0].contains("input_schema"));
  // Turn 2's two results travel in one user turn, both marked as errors.
  const json& results = fourth["messages"].back();
  EXPECT_EQ(results["role"], "user");
  ASSERT_EQ(results["content"].size(), 2u);
  EXPECT_EQ(results["content"][0]["type"], "tool_result");
  EXPECT_EQ(results["content"][0]["tool_use_id"], "toolu_2_0");
  EXPECT_TRUE(results["content"][0]["is_error"].get<bool>());
  EXPECT_TRUE(results["content"][1]["is_error"].get<bool>());
}

// The command protocol: a script that answers turn n of the conversation with
// the script's turn n (counting assistant messages), logging each call.
std::string WriteCommandAgent(const std::filesystem::path& dir) {
  json turns = json::array();
  for (const auto& t : Script()) {
    json calls = json::array();
    for (size_t i = 0; i < t.size(); ++i)
      calls.push_back({{"id", "c" + std::to_string(turns.size()) + std::to_string(i)}, {"name", t[i].name},
                       {"arguments", t[i].arguments}});
    turns.push_back({{"text", ""}, {"tool_calls", calls}});
  }
  std::ofstream((dir / "turns.json").string()) << turns.dump();
  std::ofstream((dir / "agent.py").string()) << R"PY(
import json, os, sys
req = json.load(sys.stdin)
assert os.environ["KS_LLM_PROTOCOL"] == "ks-conversation-1", os.environ["KS_LLM_PROTOCOL"]
assert req["protocol"] == "ks-conversation-1"
assert [t["name"] for t in req["tools"]] == ["compile", "test", "submit"]
turn = sum(1 for m in req["messages"] if m["role"] == "assistant")
with open(os.path.join(os.path.dirname(__file__), "calls.log"), "a") as f:
    f.write("%d\n" % turn)
turns = json.load(open(os.path.join(os.path.dirname(__file__), "turns.json")))
print(json.dumps(turns[turn]))
)PY";
  return "command:python3 " + (dir / "agent.py").string();
}

int CountLines(const std::filesystem::path& p) {
  auto text = ReadFile(p.string());
  if (!text.ok()) return 0;
  return static_cast<int>(std::count(text->begin(), text->end(), '\n'));
}

TEST_F(AgentTest, CommandProtocolScriptedAgentCompilesTestsFixesAndSubmits) {
  std::string spec = WriteCommandAgent(dir_.path());
  auto llm = Client(spec);
  int64_t id = NewSearch(AgentConfig(spec));
  auto out = RunSearch(id, llm.get());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectScriptedAgentLineage(id);
  EXPECT_EQ(CountLines(dir_ / "calls.log"), 5);
}

TEST_F(AgentTest, RecordedAgentConversationReplaysExactly) {
  std::string spec = WriteCommandAgent(dir_.path());
  LlmConfig config;
  config.spec = spec;
  config.record_path = (dir_ / "agent.jsonl").string();
  auto recording = MakeLlmClient(config);
  ASSERT_TRUE(recording.ok()) << recording.status().ToString();
  int64_t id = NewSearch(AgentConfig(spec));
  ASSERT_TRUE(RunSearch(id, recording->get()).ok());
  ExpectScriptedAgentLineage(id);
  ASSERT_EQ(CountLines(dir_ / "calls.log"), 5);

  // A second store, the transcript as the model: the same conversation, no command run.
  auto replay_store = LineageStore::Open((dir_ / "replay.db").string());
  ASSERT_TRUE(replay_store.ok());
  std::swap(store_, *replay_store);
  judge_ = std::make_unique<ScriptedEvaluator>(ScriptedEvaluatorOptions{});
  practice_ = std::make_unique<ScriptedEvaluator>(ScriptedEvaluatorOptions{});
  auto replay = Client("replay:" + config.record_path);
  int64_t replay_id = NewSearch(AgentConfig("replay:" + config.record_path));
  auto out = RunSearch(replay_id, replay.get());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status, SearchStatus::kFinished);
  ExpectScriptedAgentLineage(replay_id);
  EXPECT_EQ(CountLines(dir_ / "calls.log"), 5);
}

TEST_F(AgentTest, ToolCallBudgetStopsTheAgentCleanly) {
  std::string spec = WriteCommandAgent(dir_.path());
  auto llm = Client(spec);
  SearchConfig c = AgentConfig(spec);
  c.agent_tool_calls = 2;  // turn 0's compile and turn 1's first call
  int64_t id = NewSearch(c);
  auto out = RunSearch(id, llm.get());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(CountLines(dir_ / "calls.log"), 2);
  EXPECT_EQ(store_->ListAttempts(id)->size(), 2u);
  EXPECT_TRUE(store_->ListCandidates(id)->empty());  // nothing tested correct: nothing to judge
}

TEST_F(AgentTest, TurnBudgetJudgesTheLastDraftThatTestedCorrect) {
  std::string spec = WriteCommandAgent(dir_.path());
  auto llm = Client(spec);
  SearchConfig c = AgentConfig(spec);
  c.agent_turns = 4;  // ends after turn 3's passing test, before it submits
  int64_t id = NewSearch(c);
  auto out = RunSearch(id, llm.get());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto cands = *store_->ListCandidates(id);
  ASSERT_EQ(cands.size(), 1u);
  EXPECT_EQ(cands[0].source, Src("FAKE_MS(0.5)"));
  EXPECT_EQ(cands[0].evaluation->status, EvalStatus::kCorrect);
}

TEST_F(AgentTest, SearchCallBudgetStopsMidConversationAndResumeRepeatsNoModelCall) {
  testing::FakeLlmServer server;
  std::vector<testing::FakeReply> replies;
  auto script = Script();
  for (size_t t = 0; t < script.size(); ++t) replies.push_back({200, OpenAiTurn(t, script[t])});
  // Past the script: an error, so that a repeated call would show in the lineage too.
  replies.push_back({500, R"({"error":{"message":"script used up"}})"});
  server.Script(replies);
  std::string spec = "openai:gpt-test@" + server.openai_base();
  auto llm = Client(spec);
  SearchConfig c = AgentConfig(spec);
  c.budget_calls = 3;
  int64_t id = NewSearch(c);
  auto first = RunSearch(id, llm.get());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(server.seen().size(), 3u);
  EXPECT_TRUE(store_->ListCandidates(id)->empty());
  EXPECT_EQ(store_->ListAttempts(id)->size(), 5u);  // turns 0..2 and their tool calls, stored

  // More budget, then resume: the stored turns and tool results are replayed.
  c.budget_calls = 0;
  ASSERT_TRUE(store_->SetSearchConfig(id, SearchConfigToJson(c).dump()).ok());
  ASSERT_TRUE(store_->SetSearchStatus(id, SearchStatus::kRunning, "").ok());
  auto second = RunSearch(id, llm.get());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(server.seen().size(), 5u);  // turns 3 and 4 only: no paid call repeated
  EXPECT_EQ(second->llm_calls_now, 2);
  ExpectScriptedAgentLineage(id);
}

TEST_F(AgentTest, CancelMidConversationThenResumeRepeatsNoModelCall) {
  testing::FakeLlmServer server;
  std::vector<testing::FakeReply> replies;
  auto script = Script();
  for (size_t t = 0; t < script.size(); ++t) replies.push_back({200, OpenAiTurn(t, script[t])});
  replies.push_back({500, R"({"error":{"message":"script used up"}})"});
  server.Script(replies);
  std::string spec = "openai:gpt-test@" + server.openai_base();
  auto llm = Client(spec);
  int64_t id = NewSearch(AgentConfig(spec));
  {
    ScriptedEvaluatorOptions slow;
    slow.delay_ms = 200;  // time to cancel between turns
    ScriptedEvaluator practice(slow);
    std::atomic<bool> cancel{false};
    Orchestrator orch({.store = store_.get(), .llm = llm.get(), .evaluator = judge_.get(), .prompts = &prompts_,
                       .cancel = &cancel, .practice_evaluator = &practice},
                      nullptr);
    // Cancelled once turn 1's reply is stored and its first tool call ran
    // (a call cut short by the cancel itself was never answered, and is sent again).
    std::thread watcher([&] {
      while (store_->ListAttempts(id)->size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      cancel = true;
    });
    auto out = orch.Run(id);
    watcher.join();
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(out->status, SearchStatus::kCancelled);
  }
  EXPECT_EQ(server.seen().size(), 2u);
  auto resumed = RunSearch(id, llm.get());
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->status, SearchStatus::kFinished);
  EXPECT_EQ(server.seen().size(), 5u);
  std::set<std::string> bodies;
  for (const auto& r : server.seen()) bodies.insert(r.body);
  EXPECT_EQ(bodies.size(), 5u);  // no request sent twice
}

TEST_F(AgentTest, ProfileIsOfferedWhereThePracticeEvaluatorReadsCounters) {
  LaunchCounters l;
  l.kernel = "k";
  l.duration_ms = 0.5;
  l.dram_pct = 87;
  l.achieved_occupancy_pct = 61;
  ScriptedEvaluatorOptions with_counters;
  with_counters.counters = CounterReport{{l}, "", 0.4};
  practice_ = std::make_unique<ScriptedEvaluator>(with_counters);
  testing::FakeLlmServer server;
  server.Script({{200, OpenAiTurn(0, {{"profile", Args("FAKE_MS(0.5)")}})},
                 {200, OpenAiTurn(1, {{"submit", Args("FAKE_MS(0.5)")}})}});
  std::string spec = "openai:gpt-test@" + server.openai_base();
  auto llm = Client(spec);
  int64_t id = NewSearch(AgentConfig(spec));
  auto out = RunSearch(id, llm.get());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto seen = server.seen();
  ASSERT_EQ(seen.size(), 2u);
  json tools = json::parse(seen[0].body)["tools"];
  ASSERT_EQ(tools.size(), 4u);
  EXPECT_EQ(tools[2]["function"]["name"], "profile");
  auto attempts = *store_->ListAttempts(id);
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].status, "profiled");
  EXPECT_NE(attempts[0].result.find("87"), std::string::npos) << attempts[0].result;
  EXPECT_EQ(practice_->profiled(), 1);
  EXPECT_EQ(store_->ListCandidates(id)->size(), 1u);
}

TEST(AgentToolsTest, MalformedArgumentsAreToolErrorsNotFailures) {
  ToolCall bad;
  bad.name = "test";
  SetArgumentsFromText(&bad, "{not json");
  EXPECT_FALSE(bad.arguments_error.empty());
  auto reply = ReplyFromJson(json{{"text", "hi"}, {"tool_calls", {{{"name", "compile"}, {"arguments", "[1]"}}}}});
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->message.tool_calls[0].arguments_error, "the arguments are not a JSON object");
  EXPECT_EQ(reply->finish_reason, "tool_calls");
  EXPECT_FALSE(ReplyFromJson(json::array()).ok());
}

}  // namespace
}  // namespace ks
