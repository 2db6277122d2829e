// Validation at the RPC boundary: search configs, sources, names, ids, pages.
#include "server/limits.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "server/convert.h"

namespace ks::server {
namespace {

namespace pb = ::kernelsearch::v1;

TEST(ValidateSearchConfig, FillsDefaultsIncludingFiniteBudgets) {
  ConfigBounds b;
  auto c = ValidateSearchConfig(pb::SearchConfig(), b);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rounds(), b.default_rounds);
  EXPECT_EQ(c->ideas_per_round(), b.default_ideas_per_round);
  EXPECT_EQ(c->branches(), b.default_branches);
  EXPECT_EQ(c->beam(), b.default_beam);
  EXPECT_EQ(c->repair_attempts(), b.default_repair_attempts);
  EXPECT_GT(c->budget_usd(), 0);
  EXPECT_GT(c->budget_calls(), 0);
  EXPECT_GT(c->budget_tokens(), 0);
  EXPECT_GT(c->budget_minutes(), 0);
}

TEST(ValidateSearchConfig, ZeroRepairsIsKeptNotDefaulted) {
  pb::SearchConfig in;
  in.set_repair_attempts(0);
  auto c = ValidateSearchConfig(in, ConfigBounds());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->repair_attempts(), 0);
}

TEST(ValidateSearchConfig, AgentModeIsCheckedDefaultedAndConverted) {
  ConfigBounds b;
  auto plain = ValidateSearchConfig(pb::SearchConfig(), b);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->implement(), "oneshot");
  pb::SearchConfig in;
  in.set_implement("agent");
  in.set_agent_tokens(50000);
  auto c = ValidateSearchConfig(in, b);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->agent_turns(), b.default_agent_turns);
  EXPECT_EQ(c->agent_tool_calls(), b.default_agent_tool_calls);
  SearchConfig internal = ToSearchConfig(*c, SearchConfig());
  EXPECT_EQ(internal.implement, ImplementMode::kAgent);
  EXPECT_EQ(internal.agent_tokens, 50000);
  EXPECT_TRUE(internal.Validate().ok());
  EXPECT_EQ(FromSearchConfig(internal).implement(), "agent");
  for (auto bad : {std::make_pair("implement", 0), std::make_pair("agent_turns", 1),
                   std::make_pair("agent_tool_calls", 2), std::make_pair("agent_tokens", 3)}) {
    pb::SearchConfig x;
    if (bad.second == 0) x.set_implement("swarm");
    if (bad.second == 1) x.set_agent_turns(b.max_agent_turns + 1);
    if (bad.second == 2) x.set_agent_tool_calls(-1);
    if (bad.second == 3) x.set_agent_tokens(-5);
    auto r = ValidateSearchConfig(x, b);
    ASSERT_FALSE(r.ok()) << bad.first;
    EXPECT_NE(r.status().message().find(bad.first), std::string::npos) << r.status().message();
  }
}

TEST(ValidateSearchConfig, OutOfBoundsFieldsAreNamed) {
  ConfigBounds b;
  auto expect_bad = [&](pb::SearchConfig c, const std::string& field) {
    auto r = ValidateSearchConfig(c, b);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  };
  pb::SearchConfig c;
  c.set_rounds(b.max_rounds + 1);
  expect_bad(c, "rounds");
  c = {};
  c.set_rounds(-1);
  expect_bad(c, "rounds");
  c = {};
  c.set_branches(b.max_branches + 1);
  expect_bad(c, "branches");
  c = {};
  c.set_beam(-3);
  expect_bad(c, "beam");
  c = {};
  c.set_repair_attempts(-1);
  expect_bad(c, "repair_attempts");
  c = {};
  c.set_budget_usd(-1);
  expect_bad(c, "budget_usd");
  c = {};
  c.set_budget_usd(std::nan(""));
  expect_bad(c, "budget_usd");
  c = {};
  c.set_budget_usd(std::numeric_limits<double>::infinity());
  expect_bad(c, "budget_usd");
  c = {};
  c.set_budget_calls(b.max_budget_calls + 1);
  expect_bad(c, "budget_calls");
  c = {};
  c.set_budget_minutes(-5);
  expect_bad(c, "budget_minutes");
  c = {};
  c.set_target_speedup(-1);
  expect_bad(c, "target_speedup");
  // Each field within bounds, the product not: the planned search is too large.
  c = {};
  c.set_rounds(b.max_rounds);
  c.set_ideas_per_round(b.max_ideas_per_round);
  c.set_branches(b.max_branches);
  c.set_beam(b.max_beam);
  expect_bad(c, "candidates");
}

TEST(ValidateSource, SizeEmptinessAndNul) {
  EXPECT_TRUE(ValidateSource("source", "x = 1", 10).ok());
  EXPECT_EQ(ValidateSource("source", std::string(11, 'x'), 10).code(), Code::kResourceExhausted);
  EXPECT_EQ(ValidateSource("source", "", 10).code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateSource("source", std::string("a\0b", 3), 10).code(), Code::kInvalidArgument);
}

TEST(ValidateName, OnlyPlainNames) {
  EXPECT_TRUE(ValidateName("layer_norm-2.v1", 64).ok());
  for (const char* bad : {"", "../x", "a/b", ".hidden", "a b", "x;rm"})
    EXPECT_EQ(ValidateName(bad, 64).code(), Code::kInvalidArgument) << bad;
  EXPECT_EQ(ValidateName(std::string(65, 'a'), 64).code(), Code::kInvalidArgument);
}

TEST(ParseId, PositiveDecimalOnly) {
  EXPECT_EQ(*ParseId("search_id", "42"), 42);
  for (const char* bad : {"", "0", "-1", "+1", "01", "1x", "abc", "99999999999999999999999"})
    EXPECT_EQ(ParseId("search_id", bad).status().code(), Code::kInvalidArgument) << bad;
}

TEST(ResolvePageSize, DefaultClampAndNegative) {
  ServerLimits l;
  EXPECT_EQ(*ResolvePageSize(0, l), l.default_page_size);
  EXPECT_EQ(*ResolvePageSize(7, l), 7);
  EXPECT_EQ(*ResolvePageSize(l.max_page_size + 100, l), l.max_page_size);
  EXPECT_EQ(ResolvePageSize(-1, l).status().code(), Code::kInvalidArgument);
}

TEST(ResolveLeaseSeconds, DefaultAndBounds) {
  ServerLimits l;
  EXPECT_EQ(*ResolveLeaseSeconds(0, l), 60);
  EXPECT_EQ(*ResolveLeaseSeconds(5, l), 5);
  EXPECT_EQ(ResolveLeaseSeconds(0.5, l).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveLeaseSeconds(3601, l).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveLeaseSeconds(-1, l).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResolveLeaseSeconds(std::nan(""), l).status().code(), Code::kInvalidArgument);
}

TEST(Convert, ConfigRoundTripsThroughTheOrchestratorsConfig) {
  auto c = ValidateSearchConfig(pb::SearchConfig(), ConfigBounds());
  ASSERT_TRUE(c.ok());
  SearchConfig base;
  base.model = "command:/bin/true";
  SearchConfig full = ToSearchConfig(*c, base);
  EXPECT_EQ(full.model, "command:/bin/true");  // the server's, never the client's
  EXPECT_TRUE(full.Validate().ok()) << full.Validate().ToString();
  auto json = SearchConfigToJson(full);
  auto back = SearchConfigFromJson(json);
  ASSERT_TRUE(back.ok());
  pb::SearchConfig again = FromSearchConfig(*back);
  EXPECT_EQ(again.SerializeAsString(), c->SerializeAsString());
}

TEST(Convert, TheRobustnessAndPrecisionContractsTravelFromSubmit) {
  pb::SearchConfig in;
  in.set_require_robust(true);
  in.set_precision("tf32");
  auto c = ValidateSearchConfig(in, ConfigBounds());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  SearchConfig full = ToSearchConfig(*c, SearchConfig{});
  EXPECT_TRUE(full.require_robust);
  EXPECT_EQ(full.precision, Contract::kHigh);  // tf32 is an alias: stored under PyTorch's name (issue 36)
  EXPECT_EQ(ValidateSearchConfig(pb::SearchConfig(), ConfigBounds())->precision(), "highest");  // the default
  in.set_precision("kernelbench");
  EXPECT_EQ(ValidateSearchConfig(in, ConfigBounds())->precision(), "kernelbench");
  in.set_precision("fp16");
  auto bad = ValidateSearchConfig(in, ConfigBounds());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("highest, high, medium or kernelbench"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace ks::server
