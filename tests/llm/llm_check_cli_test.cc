// `kernelsearch llm check`, run as a user would run it, against the fake server.
#include <gtest/gtest.h>

#include "common/subprocess.h"
#include "tests/llm/fake_llm_server.h"
#include "tests/testing/paths.h"

namespace ks {
namespace {

using testing::FakeLlmServer;

SubprocessResult RunCli(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                        const std::vector<std::string>& unset = {}) {
  SubprocessOptions o;
  o.argv = {ks::testing::CliBinary()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = env;
  o.unset_env = unset;
  o.timeout_s = 120;
  auto r = RunSubprocess(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : SubprocessResult{};
}

TEST(LlmCheckCliTest, SucceedsAgainstAWorkingServer) {
  FakeLlmServer server;
  server.Script({{200, FakeLlmServer::OpenAiBody("ok", "stop", 12, 1)}});
  auto r = RunCli({"llm", "check", "--model", "openai:gpt-test@" + server.openai_base(), "--key-env", "KS_CHECK_KEY"},
                  {{"KS_CHECK_KEY", "sk-check-secret"}});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ok: openai:gpt-test"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("12 tokens in"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("sk-check-secret"), std::string::npos);
  ASSERT_EQ(server.seen().size(), 1u);
}

TEST(LlmCheckCliTest, MissingKeyNamesTheVariable) {
  FakeLlmServer server;
  auto r = RunCli({"llm", "check", "--model", "anthropic:claude-test@" + server.base(), "--key-env", "KS_CHECK_KEY"},
                  {}, {"KS_CHECK_KEY"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("$KS_CHECK_KEY is not set"), std::string::npos) << r.err;
  EXPECT_TRUE(server.seen().empty());
}

TEST(LlmCheckCliTest, RefusedKeyAndUnknownModelAndDeadServerAreExplained) {
  FakeLlmServer server;
  server.Script({{401, R"({"error":{"message":"invalid x-api-key"}})"}});
  auto r = RunCli({"llm", "check", "--model", "anthropic:claude-test@" + server.base(), "--key-env", "KS_CHECK_KEY"},
                  {{"KS_CHECK_KEY", "sk-wrong"}});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("authentication failed (check $KS_CHECK_KEY)"), std::string::npos) << r.err;

  server.Script({{404, R"({"error":{"message":"model 'nope' not found"}})"}});
  r = RunCli({"llm", "check", "--model", "openai:nope@" + server.openai_base()}, {});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unknown model 'nope'"), std::string::npos) << r.err;

  int dead_port;
  {
    FakeLlmServer gone;
    dead_port = gone.port();
  }
  r = RunCli({"llm", "check", "--model", "openai:m@http://127.0.0.1:" + std::to_string(dead_port) + "/v1",
              "--retries", "0"},
             {});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("is the server running"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ks
