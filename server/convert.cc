#include "server/convert.h"

#include <charconv>

#include "evaluator/judge/judge.h"

namespace ks::server {

std::string IdToString(int64_t id) { return std::to_string(id); }

StatusOr<int64_t> ParseId(const std::string& what, const std::string& id) {
  if (id.empty()) return InvalidArgument(what + " is missing");
  int64_t v = 0;
  auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), v);
  if (ec != std::errc() || end != id.data() + id.size() || v <= 0 || id[0] == '+' || id[0] == '0')
    return InvalidArgument(what + " '" + id.substr(0, 64) + "' is not an id (a positive decimal number)");
  return v;
}

pb::SearchState ToSearchState(store::SearchStatus s) {
  switch (s) {
    case store::SearchStatus::kPending: return pb::QUEUED;
    case store::SearchStatus::kRunning: return pb::RUNNING;
    case store::SearchStatus::kFinished: return pb::SUCCEEDED;
    case store::SearchStatus::kCancelled: return pb::CANCELLED;
    case store::SearchStatus::kFailed: return pb::FAILED;
  }
  return pb::SEARCH_STATE_UNSPECIFIED;
}

bool IsTerminal(store::SearchStatus s) {
  return s == store::SearchStatus::kFinished || s == store::SearchStatus::kCancelled ||
         s == store::SearchStatus::kFailed;
}

namespace {
void FillTensor(const TensorSpec& t, pb::TensorSpec* out) {
  out->set_name(t.name);
  out->set_dtype(DTypeName(t.dtype));
  out->set_is_scalar(t.is_scalar);
  if (t.is_scalar) {
    out->set_scalar_value(t.scalar_value);
  } else {
    for (int64_t d : t.shape) out->add_shape(d);
  }
}
}  // namespace

void FillSignature(const Signature& sig, pb::Signature* out) {
  out->set_name(sig.name);
  out->set_description(sig.description);
  if (sig.tolerance) {
    out->set_has_tolerance(true);
    out->set_atol(sig.tolerance->atol);
    out->set_rtol(sig.tolerance->rtol);
  }
  out->set_flops(sig.flops.value_or(0));
  for (const auto& t : sig.inputs) FillTensor(t, out->add_inputs());
  for (const auto& t : sig.parameters) FillTensor(t, out->add_parameters());
  for (const auto& t : sig.outputs) FillTensor(t, out->add_outputs());
}

SearchConfig ToSearchConfig(const pb::SearchConfig& c, const SearchConfig& server_base) {
  SearchConfig out = server_base;
  out.rounds = c.rounds();
  out.ideas = c.ideas_per_round();
  out.branches = c.branches();
  out.beam = c.beam();
  out.repair_attempts = c.repair_attempts();
  out.budget_cost_usd = c.budget_usd();
  out.budget_calls = c.budget_calls();
  out.budget_tokens = c.budget_tokens();
  out.budget_minutes = c.budget_minutes();
  out.target_speedup = c.target_speedup();
  out.require_robust = c.require_robust();
  // ValidateSearchConfig (limits.h) admitted only contract names, in canonical form.
  if (auto contract = ParseContract(c.precision()); !c.precision().empty() && contract.ok()) out.precision = *contract;
  // ValidateSearchConfig (limits.h) admitted only the two names.
  if (auto mode = ParseImplementMode(c.implement()); !c.implement().empty() && mode.ok()) out.implement = *mode;
  if (c.agent_turns() > 0) out.agent_turns = c.agent_turns();
  if (c.agent_tool_calls() > 0) out.agent_tool_calls = c.agent_tool_calls();
  out.agent_tokens = c.agent_tokens();
  return out;
}

pb::SearchConfig FromSearchConfig(const SearchConfig& c) {
  pb::SearchConfig out;
  out.set_rounds(c.rounds);
  out.set_ideas_per_round(c.ideas);
  out.set_branches(c.branches);
  out.set_beam(c.beam);
  out.set_repair_attempts(c.repair_attempts);
  out.set_budget_usd(c.budget_cost_usd);
  out.set_budget_calls(c.budget_calls);
  out.set_budget_tokens(c.budget_tokens);
  out.set_budget_minutes(c.budget_minutes);
  out.set_target_speedup(c.target_speedup);
  out.set_require_robust(c.require_robust);
  out.set_precision(ContractName(c.precision));
  out.set_implement(ImplementModeName(c.implement));
  out.set_agent_turns(c.agent_turns);
  out.set_agent_tool_calls(c.agent_tool_calls);
  out.set_agent_tokens(c.agent_tokens);
  return out;
}

void FillSearchInfo(const store::SearchSummary& s, pb::SearchInfo* out) {
  out->set_search_id(IdToString(s.search.id));
  out->set_problem_id(IdToString(s.search.problem_id));
  out->set_problem_name(s.problem_name);
  out->set_state(ToSearchState(s.search.status));
  nlohmann::json cfg = nlohmann::json::parse(s.search.config_json, nullptr, /*allow_exceptions=*/false);
  if (auto parsed = SearchConfigFromJson(cfg); parsed.ok()) *out->mutable_config() = FromSearchConfig(*parsed);
  out->set_rounds_done(s.rounds);
  out->set_candidates_evaluated(static_cast<int32_t>(s.evaluated));
  out->set_candidates_correct(static_cast<int32_t>(s.correct));
  if (s.search.best_candidate) out->set_best_candidate_id(IdToString(*s.search.best_candidate));
  out->set_best_speedup(s.best_speedup_eager.value_or(0));
  out->set_best_time_ms(s.best_median_ms.value_or(0));
  if (s.search.status == store::SearchStatus::kFailed) out->set_error(s.search.stop_reason);
  out->set_stop_reason(s.search.stop_reason);
  out->set_created(s.search.created);
  out->set_updated(s.search.updated);
  out->set_cost_usd(s.spend.cost_usd);
  out->set_failed_llm_calls(static_cast<int32_t>(s.failed_calls));
  out->set_first_llm_error(s.first_llm_error);
}

void FillCandidateSummary(const store::CandidateRow& c, pb::CandidateSummary* out) {
  out->set_candidate_id(IdToString(c.id));
  out->set_search_id(IdToString(c.search_id));
  if (c.parent_candidate) out->set_parent_id(IdToString(*c.parent_candidate));
  if (c.idea_id) out->set_idea_id(IdToString(*c.idea_id));
  out->set_round(c.round);
  if (c.evaluation) {
    out->set_status(EvalStatusName(c.evaluation->status));
    out->set_median_ms(c.evaluation->median_ms.value_or(0));
    out->set_speedup_eager(c.evaluation->speedup_eager.value_or(0));
    out->set_speedup_compile(c.evaluation->speedup_compile.value_or(0));
    nlohmann::json e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      out->set_message(e["message"].get<std::string>());
  } else {
    out->set_status(c.evaluated ? "evaluated" : "pending");
  }
}

}  // namespace ks::server
