// The configuration of one search: shape of the tree (rounds, ideas, branches,
// beam, repairs), budgets, target, models per role, seed. Stored as JSON in the
// search's row, so that a resumed or split search runs with exactly the settings
// it started with. Plain data.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evaluator/evaluation.h"
#include "evaluator/judge/judge.h"
#include "search/prompts.h"

namespace ks {

// How an idea becomes a candidate (SearchConfig::implement); named "oneshot"
// and "agent" on the command line, in the store and over gRPC.
enum class ImplementMode { kOneShot, kAgent };
const char* ImplementModeName(ImplementMode mode);
// InvalidArgument for any other name.
StatusOr<ImplementMode> ParseImplementMode(const std::string& name);

struct SearchConfig {
  // Improvement rounds after round 0 (round 0 finds a first correct kernel), so
  // a search has rounds + 1 rounds in all.
  int rounds = 3;
  int ideas = 4;            // I: ideas asked for per beam kernel per round
  int branches = 2;         // K: independent implementations per idea
  int beam = 2;             // B: kernels carried into the next round
  int repair_attempts = 1;  // repairs chained onto a failed candidate (0 = none)
  // Hardware counters (Nsight Compute) of the fastest correct candidates of
  // each round, for the next round's prompts: how many (0 = none). Each costs
  // one more verified run under the profiler, seconds, not minutes.
  int profile_top = 1;

  // Budgets; 0 = unlimited. All count the whole search: a resumed or split
  // search adds up the calls, tokens, cost and wall time of every process that
  // ran part of it (wall time is stored per search, see SearchRow::elapsed_s).
  int64_t budget_calls = 0;
  int64_t budget_tokens = 0;
  double budget_cost_usd = 0;
  double budget_minutes = 0;
  double target_speedup = 0;  // stop once a correct kernel is this much faster than eager; 0 = none

  std::string model;                             // the default LLM spec (llm_factory.h)
  std::map<std::string, std::string> role_models;  // "ideas" / "implement" / "repair" -> spec
  uint64_t seed = 42;  // breaks exact ties in beam selection reproducibly
  int llm_concurrency = 8;  // model calls in flight at once

  // A user-supplied first kernel (--seed-kernel), stored with the search.
  std::string seed_source;
  std::string seed_plan;
  std::string seed_label;  // where it came from, for the lineage

  // What prompts say about the GPU. Fixed when the search is created so that
  // the model side (maybe on a machine without the GPU) renders the same prompts
  // as a run on the GPU node.
  GpuFacts gpu;

  // Show the model the best kernels the store holds for similar problems (the
  // kernel bank, search/kernel_bank.h) in round 0 and in ideas prompts.
  bool bank = true;

  // Search even when the reference is degenerate (its outputs cannot tell a
  // right kernel from a wrong one). Checked on the GPU side, where the
  // reference is computed (search/search_setup.h), so it travels with the search.
  bool allow_degenerate = false;
  // `search --require robust`: a kernel correct on the get_inputs() sets but
  // broken by a distribution-shifted set (Evaluation::specialised) counts as
  // incorrect, and its repair prompt names the transform. Otherwise it is
  // correct, ranked after every robust kernel.
  bool require_robust = false;

  // The precision contract candidates are held to (evaluator/judge/judge.h).
  // Stored by its canonical name (ContractName; the aliases "fp32" and "tf32"
  // of older stores are read back as highest and high), so that a resumed
  // search, evaluate-pending and the server judge the same way.
  Contract precision = Contract::kHighest;

  // The implement step: one reply per idea and branch (the default), or an
  // agent's conversation with compile/test tools on practice input sets
  // (search/agent.h), bounded per implementation by these. Stored by name.
  ImplementMode implement = ImplementMode::kOneShot;
  int agent_turns = 8;
  int agent_tool_calls = 12;
  int64_t agent_tokens = 0;  // 0 = no limit per implementation

  Status Validate() const;
};

nlohmann::json SearchConfigToJson(const SearchConfig& c);
// Unknown keys are an error (a typo must not silently run a different search);
// absent keys keep their defaults, so a config file may set only a few.
StatusOr<SearchConfig> SearchConfigFromJson(const nlohmann::json& j);
// Reads a JSON config file (comments not allowed) over `base`.
StatusOr<SearchConfig> LoadSearchConfigFile(const std::string& path, const SearchConfig& base);

// The search's policy on an evaluation stored for it (store::LineageStore::
// SetEvaluationPolicy: a GPU worker's report, a twin's copy): --require
// robust (ApplyRobustPolicy). A config that does not parse leaves it as is.
void ApplySearchPolicy(const std::string& config_json, Evaluation& evaluation);

nlohmann::json GpuFactsToJson(const GpuFacts& g);
GpuFacts GpuFactsFromJson(const nlohmann::json& j);

}  // namespace ks
