// The openai and anthropic backends against a loopback fake server: each case
// ends in the right record, no crash, and the key never shows.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "llm/llm_factory.h"
#include "search/response_parser.h"
#include "tests/llm/fake_llm_server.h"

namespace ks {
namespace {

using testing::FakeLlmServer;
using testing::FakeReply;

constexpr char kKeyEnv[] = "KS_TEST_LLM_KEY";
constexpr char kKey[] = "sk-test-SECRET-0123456789abcdef";

// The key must not appear anywhere a user or the store could see it.
void ExpectNoKey(const LlmCallRecord& r, const Status& s) {
  for (const std::string* f : {&r.role, &r.backend, &r.model, &r.system, &r.prompt, &r.response,
                               &r.finish_reason, &r.error, &s.message()})
    EXPECT_EQ(f->find(kKey), std::string::npos) << *f;
}

class LlmHttpTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv(kKeyEnv, kKey, 1); }
  void TearDown() override { unsetenv(kKeyEnv); }

  LlmConfig Config(const std::string& spec) {
    LlmConfig c;
    c.spec = spec;
    c.api_key_env = kKeyEnv;
    c.timeout_s = 30;           // generous: a loaded 2-core machine
    c.connect_timeout_s = 10;
    c.retry_base_s = 0.05;
    c.retry_max_s = 2;
    c.price_in_per_mtok = 2.0;
    c.price_out_per_mtok = 10.0;
    return c;
  }
  LlmConfig OpenAi() { return Config("openai:gpt-test@" + server_.openai_base()); }
  LlmConfig Anthropic() { return Config("anthropic:claude-test@" + server_.base()); }

  std::unique_ptr<LlmClient> Make(const LlmConfig& c) {
    auto client = MakeLlmClient(c);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  static LlmRequest Request(const std::string& prompt = "write a kernel") {
    LlmRequest r;
    r.role = "implement";
    r.system = "you are terse";
    r.prompt = prompt;
    r.temperature = 0.3;
    r.max_tokens = 100;
    return r;
  }

  FakeLlmServer server_;
};

TEST_F(LlmHttpTest, OpenAiSuccessFillsRecord) {
  server_.Script({{200, FakeLlmServer::OpenAiBody("hello kernel", "stop", 1000, 500)}});
  auto client = Make(OpenAi());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "hello kernel");
  EXPECT_EQ(rec.response, "hello kernel");
  EXPECT_EQ(rec.backend, "openai");
  EXPECT_EQ(rec.model, "gpt-test");
  EXPECT_EQ(rec.role, "implement");
  EXPECT_EQ(rec.prompt, "write a kernel");
  EXPECT_EQ(rec.finish_reason, "stop");
  EXPECT_EQ(rec.tokens_in, 1000);
  EXPECT_EQ(rec.tokens_out, 500);
  EXPECT_NEAR(rec.cost_usd, (1000 * 2.0 + 500 * 10.0) / 1e6, 1e-12);
  EXPECT_EQ(rec.attempts, 1);
  EXPECT_GT(rec.latency_s, 0);
  EXPECT_TRUE(rec.error.empty());
  ExpectNoKey(rec, r.status());

  auto seen = server_.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].path, "/v1/chat/completions");
  EXPECT_EQ(seen[0].headers.find("Authorization")->second, std::string("Bearer ") + kKey);
  auto body = nlohmann::json::parse(seen[0].body);
  EXPECT_EQ(body["model"], "gpt-test");
  EXPECT_EQ(body["max_tokens"], 100);
  EXPECT_DOUBLE_EQ(body["temperature"].get<double>(), 0.3);
  ASSERT_EQ(body["messages"].size(), 2u);
  EXPECT_EQ(body["messages"][0]["role"], "system");
  EXPECT_EQ(body["messages"][1]["content"], "write a kernel");
}

TEST_F(LlmHttpTest, OpenAiReasoningEffortAndOverrides) {
  server_.Script({{200, FakeLlmServer::OpenAiBody("ok")}});
  LlmConfig c = OpenAi();
  c.reasoning_effort = "high";
  c.max_tokens = 4096;
  auto client = Make(c);
  ASSERT_TRUE(client->Complete(Request(), nullptr).ok());
  auto body = nlohmann::json::parse(server_.seen().at(0).body);
  EXPECT_EQ(body["reasoning_effort"], "high");
  EXPECT_EQ(body["max_completion_tokens"], 4096);
  EXPECT_FALSE(body.contains("temperature"));
  EXPECT_FALSE(body.contains("max_tokens"));
}

TEST_F(LlmHttpTest, AnthropicSuccessAndHeaders) {
  server_.Script({{200, FakeLlmServer::AnthropicBody("bonjour", "end_turn", 40, 3)}});
  auto client = Make(Anthropic());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "bonjour");
  EXPECT_EQ(rec.backend, "anthropic");
  EXPECT_EQ(rec.finish_reason, "stop");
  EXPECT_EQ(rec.tokens_in, 40);
  EXPECT_EQ(rec.tokens_out, 3);
  EXPECT_NEAR(rec.cost_usd, (40 * 2.0 + 3 * 10.0) / 1e6, 1e-12);
  auto seen = server_.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].path, "/v1/messages");
  EXPECT_EQ(seen[0].headers.find("x-api-key")->second, kKey);
  EXPECT_EQ(seen[0].headers.find("anthropic-version")->second, "2023-06-01");
  auto body = nlohmann::json::parse(seen[0].body);
  EXPECT_EQ(body["system"], "you are terse");
  EXPECT_EQ(body["max_tokens"], 100);
  EXPECT_EQ(body["messages"][0]["role"], "user");
}

TEST_F(LlmHttpTest, RateLimitedWithRetryAfterThenSuccess) {
  server_.Script({{429, R"({"error":{"message":"slow down"}})", {{"Retry-After", "1"}}},
                  {200, FakeLlmServer::OpenAiBody("after the wait")}});
  auto client = Make(OpenAi());
  LlmCallRecord rec;
  auto start = std::chrono::steady_clock::now();
  auto r = client->Complete(Request(), &rec);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "after the wait");
  EXPECT_EQ(rec.attempts, 2);
  // Retry-After (1 s) wins over the 0.05 s back-off.
  EXPECT_GE(waited, 0.95);
  EXPECT_GE(rec.latency_s, 0.95);
}

TEST_F(LlmHttpTest, ServerErrorThenSuccessAnthropic) {
  server_.Script({{500, R"({"type":"error","error":{"type":"api_error","message":"boom"}})"},
                  {529, R"({"type":"error","error":{"type":"overloaded_error","message":"busy"}})"},
                  {200, FakeLlmServer::AnthropicBody("third time")}});
  auto client = Make(Anthropic());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "third time");
  EXPECT_EQ(rec.attempts, 3);
  EXPECT_TRUE(rec.error.empty());
}

TEST_F(LlmHttpTest, ServerErrorsUntilRetriesRunOut) {
  server_.Script({{503, R"({"error":{"message":"down for maintenance"}})"}});
  LlmConfig c = OpenAi();
  c.max_retries = 2;
  auto client = Make(c);
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_EQ(rec.attempts, 3);
  EXPECT_NE(rec.error.find("down for maintenance"), std::string::npos) << rec.error;
  EXPECT_NE(rec.error.find("3 attempts"), std::string::npos) << rec.error;
  EXPECT_TRUE(rec.response.empty());
}

TEST_F(LlmHttpTest, SlowerThanTimeLimit) {
  server_.Script({{200, FakeLlmServer::OpenAiBody("too late"), {}, 5.0}});
  LlmConfig c = OpenAi();
  c.timeout_s = 1;
  c.max_retries = 0;
  auto client = Make(c);
  LlmCallRecord rec;
  auto start = std::chrono::steady_clock::now();
  auto r = client->Complete(Request(), &rec);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDeadlineExceeded) << r.status().ToString();
  EXPECT_LT(took, 4.0);
  EXPECT_EQ(rec.attempts, 1);
  EXPECT_FALSE(rec.error.empty());
  ExpectNoKey(rec, r.status());
}

TEST_F(LlmHttpTest, MalformedJsonNamesTheProblem) {
  server_.Script({{200, "{\"choices\": [ this is not json"}});
  auto client = Make(OpenAi());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(rec.error.find("malformed JSON"), std::string::npos) << rec.error;
  EXPECT_NE(rec.error.find("this is not json"), std::string::npos) << rec.error;  // the excerpt
  EXPECT_EQ(rec.error, r.status().message());
}

TEST_F(LlmHttpTest, JsonWithoutChoicesIsAnError) {
  server_.Script({{200, R"({"object": "chat.completion"})"}});
  auto client = Make(OpenAi());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(rec.error.find("choices"), std::string::npos) << rec.error;
}

TEST_F(LlmHttpTest, TruncatedReplyIsReturnedAndMarked) {
  server_.Script({{200, FakeLlmServer::OpenAiBody("```cuda\nextern \"C\" __global__ void k(", "length")}});
  auto client = Make(OpenAi());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(rec.finish_reason, "length");
  EXPECT_TRUE(rec.truncated());
  EXPECT_NE(r->find("__global__"), std::string::npos);
}

TEST_F(LlmHttpTest, AnthropicMaxTokensIsNormalizedToLength) {
  server_.Script({{200, FakeLlmServer::AnthropicBody("cut", "max_tokens")}});
  auto client = Make(Anthropic());
  LlmCallRecord rec;
  ASSERT_TRUE(client->Complete(Request(), &rec).ok());
  EXPECT_TRUE(rec.truncated());
}

TEST_F(LlmHttpTest, ReplyWithoutCodeBlockIsParseErrorKeepingRawText) {
  const std::string text = "I would use shared memory tiling here, but I will not write the code.";
  server_.Script({{200, FakeLlmServer::OpenAiBody(text)}});
  auto client = Make(OpenAi());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_TRUE(r.ok());
  ParsedCandidate parsed = ParseCandidateResponse(*r);
  EXPECT_FALSE(parsed.ok());
  EXPECT_FALSE(parsed.parse_error.empty());
  EXPECT_EQ(parsed.raw, text);
}

TEST_F(LlmHttpTest, WrongKeyIsAuthenticationFailureWithoutTheKey) {
  // Servers sometimes echo the key back; it must not reach the record.
  server_.Script({{401, std::string(R"({"error":{"message":"Incorrect API key provided: )") + kKey + "\"}}"}});
  auto client = Make(OpenAi());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnauthenticated);
  EXPECT_NE(rec.error.find("authentication failed (check $KS_TEST_LLM_KEY)"), std::string::npos) << rec.error;
  EXPECT_EQ(rec.attempts, 1);  // not retried
  EXPECT_NE(rec.error.find("[redacted]"), std::string::npos) << rec.error;
  ExpectNoKey(rec, r.status());
  EXPECT_EQ(client->Describe().find(kKey), std::string::npos);
}

TEST_F(LlmHttpTest, UnknownModelSaysSo) {
  server_.Script({{404, R"({"type":"error","error":{"type":"not_found_error","message":"model: claude-test"}})"}});
  auto client = Make(Anthropic());
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(rec.error.find("unknown model 'claude-test'"), std::string::npos) << rec.error;

  server_.Script({{400, R"({"error":{"message":"The model `gpt-test` does not exist"}})"}});
  auto openai = Make(OpenAi());
  r = openai->Complete(Request(), &rec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(rec.error.find("unknown model 'gpt-test'"), std::string::npos) << rec.error;
}

TEST_F(LlmHttpTest, MissingKeyNamesTheVariable) {
  unsetenv(kKeyEnv);
  auto client = MakeLlmClient(OpenAi());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(client.status().message().find("$KS_TEST_LLM_KEY"), std::string::npos);
}

TEST_F(LlmHttpTest, LocalServerNeedsNoKeyByDefault) {
  server_.Script({{200, FakeLlmServer::OpenAiBody("local")}});
  LlmConfig c = OpenAi();
  c.api_key_env.clear();  // default OPENAI_API_KEY, optional for a custom base URL
  std::string saved = std::getenv("OPENAI_API_KEY") ? std::getenv("OPENAI_API_KEY") : "";
  unsetenv("OPENAI_API_KEY");
  auto client = Make(c);
  auto r = client->Complete(Request(), nullptr);
  if (!saved.empty()) setenv("OPENAI_API_KEY", saved.c_str(), 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(server_.seen().at(0).headers.count("Authorization"), 0u);
}

TEST_F(LlmHttpTest, ConnectionRefusedIsUnavailable) {
  int dead_port;
  {
    FakeLlmServer gone;
    dead_port = gone.port();
  }
  LlmConfig c = Config("openai:gpt-test@http://127.0.0.1:" + std::to_string(dead_port) + "/v1");
  c.max_retries = 1;
  auto client = Make(c);
  LlmCallRecord rec;
  auto r = client->Complete(Request(), &rec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_EQ(rec.attempts, 2);  // network errors are retried
}

TEST_F(LlmHttpTest, CancellationStopsASlowCall) {
  server_.Script({{200, FakeLlmServer::OpenAiBody("never"), {}, 20.0}});
  auto client = Make(OpenAi());
  std::atomic<bool> cancel{false};
  LlmRequest req = Request();
  req.cancel = &cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel = true;
  });
  auto start = std::chrono::steady_clock::now();
  LlmCallRecord rec;
  auto r = client->Complete(req, &rec);
  canceller.join();
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCancelled);
  EXPECT_LT(took, 10.0);
  EXPECT_FALSE(rec.error.empty());
}

TEST_F(LlmHttpTest, ConcurrencyLimitHoldsCallsBack) {
  server_.Script({{200, FakeLlmServer::OpenAiBody("ok"), {}, 0.2}});
  LlmConfig c = OpenAi();
  c.concurrency = 1;
  auto client = Make(c);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&] {
      if (client->Complete(Request(), nullptr).ok()) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(server_.max_in_flight(), 1);
}

TEST(LlmFactoryTest, BadSpecsAreInvalidArguments) {
  for (const char* spec : {"gpt-4o", "nosuch:model", "openai:", "command:", "replay:"}) {
    LlmConfig c;
    c.spec = spec;
    auto client = MakeLlmClient(c);
    ASSERT_FALSE(client.ok()) << spec;
    EXPECT_EQ(client.status().code(), Code::kInvalidArgument) << spec << ": " << client.status().ToString();
  }
}

}  // namespace
}  // namespace ks
