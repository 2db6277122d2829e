// The search loop (DESIGN.md "The loop"): round 0 finds a first correct kernel
// (from the model with the idea "a straightforward correct implementation", or
// a user's seed kernel); each later round asks, for each of the best B correct
// kernels, for I ideas conditioned on that kernel, its measurements and the
// ideas already tried in its lineage; turns each idea into K independent
// candidates; evaluates them; repairs failures; and selects the next beam
// (fastest correct, near-ties broken toward different ideas).
//
// Everything goes through the lineage store, one committed step at a time:
// every model call is stored when it returns, every candidate when it is
// parsed, every evaluation when it is measured. Run() on a half-done search
// (after kill -9, a cancel, or a --generate-only step) continues it: steps are
// keyed by slot keys, finished model calls are found again by role, prompt hash
// and slot, and evaluated candidates are never evaluated again. Identical
// candidates (same normalized source and plan) are evaluated once per problem.
//
// Pipelining: model calls run on a bounded pool of threads; the thread that
// called Run() evaluates whatever is pending in batches while calls are still in
// flight, and asks for repairs as soon as a failure is known.
//
// Ownership and threading: an Orchestrator borrows the store, the LLM client, the
// evaluator and the prompt library (all must outlive it; the first three must be
// thread-safe). One Run()/EvaluatePending() at a time per Orchestrator. Cancel()
// may be called from any thread. The event callback is called from the Run()
// thread and from pool threads, but never concurrently (calls are serialized),
// and must not call back into the Orchestrator.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evaluator/evaluator_api.h"
#include "llm/llm_client.h"
#include "search/prompt_template.h"
#include "search/search_config.h"
#include "store/lineage_store.h"

namespace ks {

// The idea a first round implements.
inline constexpr const char* kFirstIdea = "a straightforward correct implementation";

// Progress, as plain data (the gRPC server streams these; the CLI prints them).
struct SearchEvent {
  enum class Type {
    kRoundStarted,        // round, text = beam description
    kIdeaProposed,        // round, idea_id, candidate_id = parent, text = idea
    kCandidateGenerated,  // round, idea_id, candidate_id
    kCandidateEvaluated,  // round, candidate_id, eval_status, speedup, reused
    kNewBest,             // candidate_id, speedup
    kLlmCall,             // text = role, error in `error`; totals updated
    kFinished,            // final_status, text = stop reason
    kNote,                // text: something the user should know once (no hardware counters: why)
  };
  Type type = Type::kRoundStarted;
  int64_t search_id = 0;
  int round = -1;
  int64_t idea_id = 0;
  int64_t candidate_id = 0;
  std::string text;
  std::string error;
  std::optional<EvalStatus> eval_status;
  std::optional<double> speedup;       // this candidate's speedup over eager
  std::optional<double> best_speedup;  // the search's best so far
  bool reused = false;                 // evaluation copied from an identical candidate / call from the store
  // Totals of the search so far (store-wide, so a resumed search keeps counting).
  int64_t evaluated = 0;
  int64_t failed = 0;
  int64_t llm_calls = 0;
  int64_t llm_failed = 0;  // model calls that failed, in this process
  int64_t tokens = 0;
  double cost_usd = 0;
  store::SearchStatus final_status = store::SearchStatus::kRunning;
};

const char* SearchEventTypeName(SearchEvent::Type t);  // "round_started", ...
nlohmann::json SearchEventToJson(const SearchEvent& e);
using SearchEventCallback = std::function<void(const SearchEvent&)>;

struct SearchOutcome {
  int64_t search_id = 0;
  store::SearchStatus status = store::SearchStatus::kRunning;
  std::string stop_reason;  // also set when a generate-only step stops: "generated round 2: 8 pending"
  std::optional<int64_t> best_candidate;
  std::optional<double> best_speedup;
  int64_t pending = 0;           // candidates waiting for evaluation
  int64_t evaluated_now = 0;     // by this call (reuses included)
  int64_t llm_calls_now = 0;     // model calls made by this call
  int64_t llm_calls_reused = 0;  // finished calls found in the store instead
  // Model calls of this call that returned an error, and the first error (what
  // a user must see: "command '...' timed out after 3600 s", "HTTP 401 ...").
  int64_t llm_failed_now = 0;
  std::string first_llm_error;
  // Where this call's time went: wall, inside EvaluateBatch, and on the Run
  // thread waiting for model calls with nothing to evaluate. The rest is the
  // orchestrator's own overhead (store, prompts, parsing, selection).
  double wall_s = 0;
  double evaluator_s = 0;
  double llm_wait_s = 0;
  // Wall time spent on the search by every process so far, this one included
  // (what --budget-minutes counts).
  double total_elapsed_s = 0;
};

// The next beam: up to `beam_size` correct candidates, fastest first; among
// kernels within 2% of the fastest remaining one (timing noise), one from an
// idea not yet in the beam goes first; exact ties go by a hash of (seed,
// content); a kernel identical to one already chosen is skipped.
std::vector<int64_t> SelectBeam(const std::vector<store::CandidateRow>& correct, int beam_size, uint64_t seed);

class Orchestrator {
 public:
  struct Deps {
    store::LineageStore* store = nullptr;     // required
    LlmClient* llm = nullptr;                 // required for Run()
    CandidateEvaluator* evaluator = nullptr;  // required for continuous Run() and EvaluatePending()
    const PromptLibrary* prompts = nullptr;   // required for Run()
    const std::atomic<bool>* cancel = nullptr;  // optional external stop flag (the server's)
    // The agent's compile/test tools (SearchConfig::implement "agent"): an
    // evaluator on PRACTICE input sets, prepared from another seed than
    // `evaluator`'s judging sets. Required for agent mode; an agent search
    // without it fails at its first implementation, saying so.
    CandidateEvaluator* practice_evaluator = nullptr;
  };
  enum class Mode {
    kContinuous,    // run the search to its end
    kGenerateOnly,  // run the model side of the next step, leave candidates pending
  };

  Orchestrator(Deps deps, SearchEventCallback on_event);
  ~Orchestrator();
  Orchestrator(const Orchestrator&) = delete;
  Orchestrator& operator=(const Orchestrator&) = delete;

  // Stores the problem (once per distinct text) and a new search in state
  // pending with `config` (validated). Returns the search id.
  static StatusOr<int64_t> CreateSearch(store::LineageStore* store, const std::string& problem_file,
                                        const std::string& problem_source, const Signature& signature,
                                        const SearchConfig& config);

  // Runs (or continues) search `search_id` with the config stored in it.
  // Errors: the store or the evaluator failing (the search is marked failed and
  // stays resumable), a bad search id, missing dependencies. A cancelled search
  // returns its outcome with status kCancelled.
  StatusOr<SearchOutcome> Run(int64_t search_id, Mode mode = Mode::kContinuous);

  // Evaluates every pending candidate of the search (the GPU side of a split
  // search). Makes no model calls and does not start rounds.
  StatusOr<SearchOutcome> EvaluatePending(int64_t search_id);

  void Cancel() { cancel_.store(true); }
  bool cancelled() const;

 private:
  class SearchRun;
  Deps deps_;
  SearchEventCallback on_event_;
  std::atomic<bool> cancel_{false};
};

}  // namespace ks
