#include "search/search_config.h"

#include <set>

#include "common/files.h"
#include "common/json_field.h"

namespace ks {

const char* ImplementModeName(ImplementMode mode) { return mode == ImplementMode::kAgent ? "agent" : "oneshot"; }

StatusOr<ImplementMode> ParseImplementMode(const std::string& name) {
  if (name == "oneshot") return ImplementMode::kOneShot;
  if (name == "agent") return ImplementMode::kAgent;
  return InvalidArgument("implement must be oneshot or agent, not '" + name + "'");
}

Status SearchConfig::Validate() const {
  if (agent_turns < 1 || agent_tool_calls < 1 || agent_tokens < 0)
    return InvalidArgument("agent budgets: turns and tool calls must be >= 1, tokens >= 0");
  if (rounds < 0) return InvalidArgument("rounds must be >= 0");
  if (ideas < 1) return InvalidArgument("ideas must be >= 1");
  if (branches < 1) return InvalidArgument("branches must be >= 1");
  if (beam < 1) return InvalidArgument("beam must be >= 1");
  if (repair_attempts < 0) return InvalidArgument("repair attempts must be >= 0");
  if (profile_top < 0) return InvalidArgument("profile_top must be >= 0");
  if (budget_calls < 0 || budget_tokens < 0 || budget_cost_usd < 0 || budget_minutes < 0)
    return InvalidArgument("budgets must be >= 0 (0 = unlimited)");
  if (target_speedup < 0) return InvalidArgument("target speedup must be >= 0");
  if (llm_concurrency < 1) return InvalidArgument("llm concurrency must be >= 1");
  for (const auto& [role, spec] : role_models) {
    if (role != "ideas" && role != "implement" && role != "repair")
      return InvalidArgument("model for unknown role '" + role + "' (ideas, implement, repair)");
  }
  if (seed_source.empty() != seed_plan.empty()) return InvalidArgument("a seed kernel needs both source and plan");
  return Status::Ok();
}

nlohmann::json GpuFactsToJson(const GpuFacts& g) {
  return {{"name", g.name},
          {"compute_capability", g.compute_capability},
          {"sm_count", g.sm_count},
          {"shared_bytes_per_block", g.shared_bytes_per_block},
          {"shared_bytes_per_sm", g.shared_bytes_per_sm},
          {"l2_bytes", g.l2_bytes},
          {"registers_per_sm", g.registers_per_sm},
          {"memory_bandwidth_gbps", g.memory_bandwidth_gbps},
          {"fp32_tflops", g.fp32_tflops},
          {"tf32_tflops", g.tf32_tflops},
          {"fp16_tensor_tflops", g.fp16_tensor_tflops},
          {"max_threads_per_sm", g.max_threads_per_sm},
          {"max_blocks_per_sm", g.max_blocks_per_sm},
          {"max_registers_per_thread", g.max_registers_per_thread},
          {"source", g.source}};
}

GpuFacts GpuFactsFromJson(const nlohmann::json& j) {
  GpuFacts g;
  if (!j.is_object()) return g;
  g.name = j.value("name", "");
  g.compute_capability = j.value("compute_capability", "");
  g.sm_count = j.value("sm_count", 0);
  g.shared_bytes_per_block = j.value("shared_bytes_per_block", int64_t{0});
  g.shared_bytes_per_sm = j.value("shared_bytes_per_sm", int64_t{0});
  g.l2_bytes = j.value("l2_bytes", int64_t{0});
  g.registers_per_sm = j.value("registers_per_sm", 0);
  g.memory_bandwidth_gbps = j.value("memory_bandwidth_gbps", 0.0);
  g.fp32_tflops = j.value("fp32_tflops", 0.0);
  g.tf32_tflops = j.value("tf32_tflops", 0.0);
  g.fp16_tensor_tflops = j.value("fp16_tensor_tflops", 0.0);
  g.max_threads_per_sm = j.value("max_threads_per_sm", 0);
  g.max_blocks_per_sm = j.value("max_blocks_per_sm", 0);
  g.max_registers_per_thread = j.value("max_registers_per_thread", 0);
  g.source = j.value("source", "");
  return g;
}

nlohmann::json SearchConfigToJson(const SearchConfig& c) {
  return {{"rounds", c.rounds},
          {"ideas", c.ideas},
          {"branches", c.branches},
          {"beam", c.beam},
          {"repair_attempts", c.repair_attempts},
          {"profile_top", c.profile_top},
          {"budget_calls", c.budget_calls},
          {"budget_tokens", c.budget_tokens},
          {"budget_cost_usd", c.budget_cost_usd},
          {"budget_minutes", c.budget_minutes},
          {"target_speedup", c.target_speedup},
          {"model", c.model},
          {"role_models", c.role_models},
          {"seed", c.seed},
          {"llm_concurrency", c.llm_concurrency},
          {"seed_source", c.seed_source},
          {"seed_plan", c.seed_plan},
          {"seed_label", c.seed_label},
          {"gpu", GpuFactsToJson(c.gpu)},
          {"bank", c.bank},
          {"allow_degenerate", c.allow_degenerate},
          {"require_robust", c.require_robust},
          {"precision", ContractName(c.precision)},
          {"implement", ImplementModeName(c.implement)},
          {"agent_turns", c.agent_turns},
          {"agent_tool_calls", c.agent_tool_calls},
          {"agent_tokens", c.agent_tokens}};
}

StatusOr<SearchConfig> SearchConfigFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("search config must be a JSON object");
  static const std::set<std::string> kKeys = {
      "rounds", "ideas", "branches", "beam", "repair_attempts", "profile_top", "budget_calls", "budget_tokens",
      "budget_cost_usd", "budget_minutes", "target_speedup", "model", "role_models", "seed",
      "llm_concurrency", "seed_source", "seed_plan", "seed_label", "gpu", "bank", "allow_degenerate",
      "require_robust", "precision", "implement", "agent_turns", "agent_tool_calls", "agent_tokens"};
  for (const auto& [key, value] : j.items())
    if (!kKeys.count(key)) return InvalidArgument("search config: unknown key '" + key + "'");
  SearchConfig c;
  try {
    ReadField(j, "rounds", &c.rounds);
    ReadField(j, "ideas", &c.ideas);
    ReadField(j, "branches", &c.branches);
    ReadField(j, "beam", &c.beam);
    ReadField(j, "repair_attempts", &c.repair_attempts);
    ReadField(j, "profile_top", &c.profile_top);
    ReadField(j, "budget_calls", &c.budget_calls);
    ReadField(j, "budget_tokens", &c.budget_tokens);
    ReadField(j, "budget_cost_usd", &c.budget_cost_usd);
    ReadField(j, "budget_minutes", &c.budget_minutes);
    ReadField(j, "target_speedup", &c.target_speedup);
    ReadField(j, "model", &c.model);
    if (j.contains("role_models")) c.role_models = j.at("role_models").get<std::map<std::string, std::string>>();
    ReadField(j, "seed", &c.seed);
    ReadField(j, "llm_concurrency", &c.llm_concurrency);
    ReadField(j, "seed_source", &c.seed_source);
    ReadField(j, "seed_plan", &c.seed_plan);
    ReadField(j, "seed_label", &c.seed_label);
    if (j.contains("gpu")) c.gpu = GpuFactsFromJson(j.at("gpu"));
    ReadField(j, "bank", &c.bank);
    ReadField(j, "allow_degenerate", &c.allow_degenerate);
    ReadField(j, "require_robust", &c.require_robust);
    std::string precision = ContractName(c.precision);
    ReadField(j, "precision", &precision);
    auto contract = ParseContract(precision);
    if (!contract.ok())
      return InvalidArgument("precision must be highest, high, medium or kernelbench (fp32, tf32: aliases), not '" +
                             precision + "'");
    c.precision = *contract;
    std::string implement = ImplementModeName(c.implement);
    ReadField(j, "implement", &implement);
    KS_ASSIGN_OR_RETURN(c.implement, ParseImplementMode(implement));
    ReadField(j, "agent_turns", &c.agent_turns);
    ReadField(j, "agent_tool_calls", &c.agent_tool_calls);
    ReadField(j, "agent_tokens", &c.agent_tokens);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("search config: ") + e.what());
  }
  KS_RETURN_IF_ERROR(c.Validate());
  return c;
}

StatusOr<SearchConfig> LoadSearchConfigFile(const std::string& path, const SearchConfig& base) {
  KS_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(path + ": not valid JSON");
  nlohmann::json merged = SearchConfigToJson(base);
  if (!j.is_object()) return InvalidArgument(path + ": search config must be a JSON object");
  for (const auto& [key, value] : j.items()) merged[key] = value;
  auto c = SearchConfigFromJson(merged);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

void ApplySearchPolicy(const std::string& config_json, Evaluation& evaluation) {
  auto j = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  auto config = SearchConfigFromJson(j);
  if (config.ok()) ApplyRobustPolicy(evaluation, config->require_robust);
}

}  // namespace ks
