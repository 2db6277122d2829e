// Record and replay, the command backend and per-role routing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "common/files.h"
#include "llm/conversation.h"
#include "llm/llm_factory.h"
#include "llm/role_router.h"
#include "llm/transcript.h"
#include "tests/llm/fake_llm_server.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using testing::FakeLlmServer;

// A file in the running test's own directory; one directory for the whole
// binary holds them, removed when the binary exits.
std::string TempPath(const std::string& name) {
  static const ks::testing::TempDir root("ks_llm_replay_");
  auto dir = root / ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

LlmRequest Req(const std::string& role, const std::string& prompt) {
  LlmRequest r;
  r.role = role;
  r.system = "system text";
  r.prompt = prompt;
  return r;
}

TEST(LlmReplayTest, RecordThenReplayGivesIdenticalResponses) {
  FakeLlmServer server;
  server.Script({{200, FakeLlmServer::OpenAiBody("[\"idea one\", \"idea two\"]", "stop", 100, 20)},
                 {200, FakeLlmServer::OpenAiBody("```cuda\nextern \"C\" __global__ void k() {}\n```", "stop", 200, 40)},
                 {200, FakeLlmServer::OpenAiBody("second implementation", "length", 200, 50)}});
  std::string transcript = TempPath("calls.jsonl");
  std::filesystem::remove(transcript);
  std::vector<LlmRequest> reqs = {Req("ideas", "give ideas"), Req("implement", "implement idea one"),
                                  Req("implement", "implement idea one")};  // same prompt twice, as B=2 does
  std::vector<LlmCallRecord> recorded(3);
  std::vector<std::string> responses;
  {
    LlmConfig c;
    c.spec = "openai:gpt-test@" + server.openai_base();
    c.record_path = transcript;
    c.price_in_per_mtok = 1;
    auto client = MakeLlmClient(c);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    for (int i = 0; i < 3; ++i) {
      auto r = (*client)->Complete(reqs[i], &recorded[i]);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      responses.push_back(*r);
    }
  }
  LlmConfig rc;
  rc.spec = "replay:" + transcript;
  auto replay = MakeLlmClient(rc);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  for (int i = 0; i < 3; ++i) {
    LlmCallRecord rec;
    auto r = (*replay)->Complete(reqs[i], &rec);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, responses[i]) << i;
    EXPECT_EQ(rec.backend, "replay");
    EXPECT_EQ(rec.model, "gpt-test");
    EXPECT_EQ(rec.finish_reason, recorded[i].finish_reason);
    EXPECT_EQ(rec.tokens_in, recorded[i].tokens_in);
    EXPECT_EQ(rec.tokens_out, recorded[i].tokens_out);
    EXPECT_DOUBLE_EQ(rec.cost_usd, recorded[i].cost_usd);
  }
  // Identical prompts are served in recorded order, then they are used up.
  LlmCallRecord rec;
  auto again = (*replay)->Complete(reqs[2], &rec);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("all have been served"), std::string::npos);
  EXPECT_EQ(server.seen().size(), 3u);  // replay never touched the network
}

TEST(LlmReplayTest, UnknownPromptFailsNamingTheHash) {
  std::string transcript = TempPath("one.jsonl");
  LlmCallRecord r;
  r.role = "ideas";
  r.system = "s";
  r.prompt = "known prompt";
  r.response = "known response";
  ASSERT_TRUE(WriteFile(transcript, CallRecordToJson(r, Status::Ok()).dump() + "\n").ok());
  LlmConfig c;
  c.spec = "replay:" + transcript;
  auto replay = MakeLlmClient(c);
  ASSERT_TRUE(replay.ok());
  LlmRequest req = Req("ideas", "a prompt nobody recorded");
  LlmCallRecord rec;
  auto out = (*replay)->Complete(req, &rec);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kNotFound);
  std::string hash = PromptHash(req.role, req.system, req.prompt);
  EXPECT_EQ(hash.size(), 64u);
  EXPECT_NE(out.status().message().find(hash), std::string::npos) << out.status().message();
  EXPECT_EQ(rec.error, out.status().message());

  // Loose replay serves the next recording of the same role instead.
  c.replay_strict = false;
  auto loose = MakeLlmClient(c);
  ASSERT_TRUE(loose.ok());
  auto served = (*loose)->Complete(req, nullptr);
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  EXPECT_EQ(*served, "known response");
}

TEST(LlmReplayTest, RecordedFailureReplaysAsFailure) {
  FakeLlmServer server;
  server.Script({{400, R"({"error":{"message":"prompt too long"}})"}});
  std::string transcript = TempPath("fail.jsonl");
  std::filesystem::remove(transcript);
  LlmConfig c;
  c.spec = "openai:m@" + server.openai_base();
  c.record_path = transcript;
  auto client = MakeLlmClient(c);
  ASSERT_TRUE(client.ok());
  auto first = (*client)->Complete(Req("ideas", "p"), nullptr);
  ASSERT_FALSE(first.ok());
  LlmConfig rc;
  rc.spec = "replay:" + transcript;
  auto replay = MakeLlmClient(rc);
  ASSERT_TRUE(replay.ok());
  auto second = (*replay)->Complete(Req("ideas", "p"), nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), first.status().code());
  EXPECT_NE(second.status().message().find("prompt too long"), std::string::npos);
}

TEST(LlmReplayTest, MissingOrBrokenTranscriptIsAnError) {
  LlmConfig c;
  c.spec = "replay:" + TempPath("does_not_exist.jsonl");
  auto missing = MakeLlmClient(c);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  std::string broken = TempPath("broken.jsonl");
  ASSERT_TRUE(WriteFile(broken, "{\"prompt\": \"x\"}\nnot json\n").ok());
  c.spec = "replay:" + broken;
  auto bad = MakeLlmClient(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":2:"), std::string::npos) << bad.status().message();
}

TEST(LlmCommandTest, EchoStyleCommand) {
  LlmConfig c;
  c.spec = "command:printf 'role=%s system=%s prompt=' \"$KS_LLM_ROLE\" \"$KS_LLM_SYSTEM\"; cat";
  c.timeout_s = 30;
  auto client = MakeLlmClient(c);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  LlmCallRecord rec;
  auto r = (*client)->Complete(Req("repair", "fix it"), &rec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "role=repair system=system text prompt=fix it");
  EXPECT_EQ(rec.backend, "command");
  EXPECT_EQ(rec.response, *r);
  EXPECT_EQ(rec.attempts, 1);
}

// Issue 22: a command: model's calls count tokens and cost like any other,
// estimated from the text unless the command reports its usage.
TEST(LlmCommandTest, TokensAreEstimatedOrReportedAndPriced) {
  LlmConfig c;
  c.spec = "command:cat >/dev/null; printf '%0400d' 0";  // 400 characters out
  c.timeout_s = 30;
  c.price_in_per_mtok = 3;
  c.price_out_per_mtok = 15;
  auto client = MakeLlmClient(c);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  LlmCallRecord rec;
  LlmRequest req = Req("implement", std::string(800, 'p'));
  auto r = (*client)->Complete(req, &rec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(rec.tokens_out, 100);
  EXPECT_EQ(rec.tokens_in, static_cast<int64_t>((req.system.size() + 3) / 4) + 200);
  EXPECT_NEAR(rec.cost_usd, (rec.tokens_in * 3.0 + rec.tokens_out * 15.0) / 1e6, 1e-12);
  EXPECT_GT(rec.cost_usd, 0);

  c.spec = "command:cat >/dev/null; echo '{\"tokens_in\": 1234, \"tokens_out\": 56}' > \"$KS_LLM_USAGE_FILE\"; echo ok";
  auto reporting = MakeLlmClient(c);
  ASSERT_TRUE(reporting.ok());
  LlmCallRecord rec2;
  ASSERT_TRUE((*reporting)->Complete(req, &rec2).ok());
  EXPECT_EQ(rec2.tokens_in, 1234);
  EXPECT_EQ(rec2.tokens_out, 56);
  EXPECT_NEAR(rec2.cost_usd, (1234 * 3.0 + 56 * 15.0) / 1e6, 1e-12);
}

TEST(LlmCommandTest, OverrunningCommandIsKilled) {
  LlmConfig c;
  c.spec = "command:sleep 20";
  c.timeout_s = 1;
  auto client = MakeLlmClient(c);
  ASSERT_TRUE(client.ok());
  auto start = std::chrono::steady_clock::now();
  LlmCallRecord rec;
  auto r = (*client)->Complete(Req("ideas", "x"), &rec);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDeadlineExceeded);
  EXPECT_LT(took, 10.0);
  EXPECT_NE(rec.error.find("sleep 20"), std::string::npos) << rec.error;
}

TEST(LlmCommandTest, FailingCommandReportsItsStderr) {
  LlmConfig c;
  c.spec = "command:echo 'model not loaded' >&2; exit 3";
  auto client = MakeLlmClient(c);
  ASSERT_TRUE(client.ok());
  LlmCallRecord rec;
  auto r = (*client)->Complete(Req("ideas", "x"), &rec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(rec.error.find("exit code 3"), std::string::npos) << rec.error;
  EXPECT_NE(rec.error.find("model not loaded"), std::string::npos) << rec.error;
}

TEST(LlmRouterTest, RolesGoToTheirOwnModelsAndShareOneTranscript) {
  std::string transcript = TempPath("routed.jsonl");
  std::filesystem::remove(transcript);
  LlmConfig base;
  base.spec = "command:echo default";
  base.record_path = transcript;
  auto client = MakeRoutedLlmClient(base, {{"ideas", "command:echo ideas-model"}});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto a = (*client)->Complete(Req("ideas", "x"), nullptr);
  auto b = (*client)->Complete(Req("implement", "y"), nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, "ideas-model\n");
  EXPECT_EQ(*b, "default\n");
  auto text = ReadFile(transcript);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(std::count(text->begin(), text->end(), '\n'), 2);

  EXPECT_FALSE(ParseRoleSpec("ideas").ok());
  auto rs = ParseRoleSpec("implement=anthropic:m@http://x");
  ASSERT_TRUE(rs.ok());
  EXPECT_EQ(rs->first, "implement");
  EXPECT_EQ(rs->second, "anthropic:m@http://x");
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

// Issue 31: a model's tool-call arguments nested 150,000 levels deep are
// kept as text with an error, never built (copying them overflowed the stack).
TEST(ConversationTest, DeeplyNestedToolArgumentsAreRefusedNotBuilt) {
  ToolCall call;
  SetArgumentsFromText(&call, "{\"plan\": " + std::string(150000, '[') + std::string(150000, ']') + "}");
  EXPECT_EQ(call.arguments_error, "the arguments are not valid JSON");
  EXPECT_TRUE(call.arguments.is_string());
  ToolCall fine;
  SetArgumentsFromText(&fine, R"({"source": "x", "plan": {"launches": []}})");
  EXPECT_TRUE(fine.arguments_error.empty());
  EXPECT_TRUE(fine.arguments.is_object());
}

}  // namespace
}  // namespace ks
