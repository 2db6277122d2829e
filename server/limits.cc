#include "server/limits.h"

#include "evaluator/judge/judge.h"
#include "search/search_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ks::server {
namespace {

Status CheckInt(const char* field, int v, int max) {
  if (v < 1 || v > max)
    return InvalidArgument(std::string("config.") + field + " = " + std::to_string(v) + ": must be in [1, " +
                           std::to_string(max) + "]");
  return Status::Ok();
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

StatusOr<kernelsearch::v1::SearchConfig> ValidateSearchConfig(const kernelsearch::v1::SearchConfig& in,
                                                              const ConfigBounds& b) {
  kernelsearch::v1::SearchConfig c = in;
  if (c.rounds() == 0) c.set_rounds(b.default_rounds);
  if (c.ideas_per_round() == 0) c.set_ideas_per_round(b.default_ideas_per_round);
  if (c.branches() == 0) c.set_branches(b.default_branches);
  if (c.beam() == 0) c.set_beam(b.default_beam);
  if (!c.has_repair_attempts()) c.set_repair_attempts(b.default_repair_attempts);
  if (c.budget_usd() == 0) c.set_budget_usd(b.default_budget_usd);
  if (c.budget_calls() == 0) c.set_budget_calls(b.default_budget_calls);
  if (c.budget_tokens() == 0) c.set_budget_tokens(b.default_budget_tokens);
  if (c.budget_minutes() == 0) c.set_budget_minutes(b.default_budget_minutes);
  auto contract = ParseContract(c.precision().empty() ? ContractName(Contract::kHighest) : c.precision());
  if (!contract.ok())
    return InvalidArgument("config.precision = '" + c.precision().substr(0, 32) +
                           "': must be highest, high, medium or kernelbench (fp32, tf32: aliases)");
  c.set_precision(ContractName(*contract));
  KS_RETURN_IF_ERROR(CheckInt("rounds", c.rounds(), b.max_rounds));
  KS_RETURN_IF_ERROR(CheckInt("ideas_per_round", c.ideas_per_round(), b.max_ideas_per_round));
  KS_RETURN_IF_ERROR(CheckInt("branches", c.branches(), b.max_branches));
  KS_RETURN_IF_ERROR(CheckInt("beam", c.beam(), b.max_beam));
  if (c.repair_attempts() < 0 || c.repair_attempts() > b.max_repair_attempts)
    return InvalidArgument("config.repair_attempts = " + std::to_string(c.repair_attempts()) + ": must be in [0, " +
                           std::to_string(b.max_repair_attempts) + "]");
  auto check_real = [](const char* field, double v, double max) -> Status {
    if (!std::isfinite(v) || v <= 0 || v > max)
      return InvalidArgument(std::string("config.") + field + " = " + Num(v) + ": must be in (0, " + Num(max) + "]");
    return Status::Ok();
  };
  auto check_count = [](const char* field, int64_t v, int64_t max) -> Status {
    if (v <= 0 || v > max)
      return InvalidArgument(std::string("config.") + field + " = " + std::to_string(v) + ": must be in [1, " +
                             std::to_string(max) + "]");
    return Status::Ok();
  };
  KS_RETURN_IF_ERROR(check_real("budget_usd", c.budget_usd(), b.max_budget_usd));
  KS_RETURN_IF_ERROR(check_count("budget_calls", c.budget_calls(), b.max_budget_calls));
  KS_RETURN_IF_ERROR(check_count("budget_tokens", c.budget_tokens(), b.max_budget_tokens));
  KS_RETURN_IF_ERROR(check_real("budget_minutes", c.budget_minutes(), b.max_budget_minutes));
  if (!std::isfinite(c.target_speedup()) || c.target_speedup() < 0 || c.target_speedup() > b.max_target_speedup)
    return InvalidArgument("config.target_speedup = " + Num(c.target_speedup()) + ": must be in [0, " +
                           Num(b.max_target_speedup) + "] (0: no target)");
  if (c.implement().empty()) c.set_implement("oneshot");
  if (!ParseImplementMode(c.implement()).ok())
    return InvalidArgument("config.implement = '" + c.implement() + "': must be oneshot or agent");
  if (c.agent_turns() == 0) c.set_agent_turns(b.default_agent_turns);
  if (c.agent_tool_calls() == 0) c.set_agent_tool_calls(b.default_agent_tool_calls);
  KS_RETURN_IF_ERROR(CheckInt("agent_turns", c.agent_turns(), b.max_agent_turns));
  KS_RETURN_IF_ERROR(CheckInt("agent_tool_calls", c.agent_tool_calls(), b.max_agent_tool_calls));
  if (c.agent_tokens() < 0 || c.agent_tokens() > b.max_agent_tokens)
    return InvalidArgument("config.agent_tokens = " + std::to_string(c.agent_tokens()) + ": must be in [0, " +
                           std::to_string(b.max_agent_tokens) + "] (0: no limit)");
  int64_t planned = (int64_t{c.rounds()} + 1) * c.beam() * c.ideas_per_round() * c.branches();
  if (planned > b.max_planned_candidates)
    return InvalidArgument("config: (rounds + 1) x beam x ideas_per_round x branches = " + std::to_string(planned) +
                           " candidates, more than the server allows (" + std::to_string(b.max_planned_candidates) +
                           ")");
  return c;
}

Status ValidateSource(const std::string& what, const std::string& text, size_t max_bytes) {
  if (text.size() > max_bytes)
    return ResourceExhausted(what + " is " + std::to_string(text.size()) + " bytes; the server takes at most " +
                             std::to_string(max_bytes));
  if (text.empty()) return InvalidArgument(what + " is empty");
  if (text.find('\0') != std::string::npos) return InvalidArgument(what + " holds a NUL byte");
  return Status::Ok();
}

Status ValidateName(const std::string& name, size_t max_bytes) {
  if (name.empty() || name.size() > max_bytes)
    return InvalidArgument("name must be 1 to " + std::to_string(max_bytes) + " characters");
  if (name[0] == '.') return InvalidArgument("name must not start with '.'");
  for (char ch : name) {
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '-' || ch == '.';
    if (!ok) return InvalidArgument("name '" + name + "' holds characters other than letters, digits, '_', '-', '.'");
  }
  return Status::Ok();
}

Status ValidateId(const std::string& what, const std::string& id) {
  if (id.empty()) return InvalidArgument(what + " is missing");
  if (id.size() > 64) return InvalidArgument(what + " is longer than 64 characters");
  for (char ch : id) {
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '-';
    if (!ok) return InvalidArgument(what + " is malformed");
  }
  return Status::Ok();
}

StatusOr<double> ResolveLeaseSeconds(double requested, const ServerLimits& limits) {
  if (requested == 0) return limits.default_lease_s;
  if (!(requested >= limits.min_lease_s && requested <= limits.max_lease_s))
    return InvalidArgument("lease_seconds must be within " + Num(limits.min_lease_s) + ".." + Num(limits.max_lease_s));
  return requested;
}

Status ValidateLeaseId(const std::string& id) {
  bool ok = id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
  return ok ? Status::Ok() : InvalidArgument("lease_id is malformed");
}

StatusOr<int> ResolvePageSize(int requested, const ServerLimits& limits) {
  if (requested < 0) return InvalidArgument("page_size must not be negative");
  if (requested == 0) return limits.default_page_size;
  return requested > limits.max_page_size ? limits.max_page_size : requested;
}

}  // namespace ks::server
