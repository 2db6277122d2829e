// The agent mode of the implement step (`search --implement agent`): one idea
// becomes a bounded conversation in which the model may call tools on its own
// drafts before it submits one candidate.
//
// What the model is told (the instructions appended to the implement prompt,
// each tool's description and its arguments') is a template, prompts/agent.md,
// rendered like every other prompt (RenderAgentText).
// Tools (JSON schemas in ToolSpecs):
//   compile(source, plan)  the practice evaluation's compile part: status,
//                          compiler log, registers, shared memory, spills and
//                          the resolved launches
//   test(source, plan)     correctness figures (per output: relative norm vs
//                          its bound, mismatches, the first wrong element by
//                          position), time, speedups, roofline fraction and
//                          per-launch figures, as the evaluator reports them
//   submit(source, plan)   ends the conversation; the candidate is judged by
//                          the search's ordinary evaluation
//   profile(source, plan)  the hardware-counter digest of each launch (Nsight
//                          Compute, evaluator/profile/counters.h), offered only where
//                          the practice evaluator can read counters
// Honest by construction: compile and test run on PRACTICE input sets (a
// reference prepared from another seed than the judging one), through the same
// sandboxed evaluator and checks; a tool answers error figures, never
// reference values. A malformed call (unknown tool, arguments that are not a
// JSON object, a missing source or plan) is answered as a tool error.
//
// Every step is stored before the next model turn: the model's turns as LLM
// calls under slot "<implement slot>/t<turn>" (found again by prompt hash on
// resume), each tool call as an attempt row (store/lineage_store.h). A resumed
// agent rebuilds the conversation from them and repeats no paid call.
// Budgets per idea: turns, tool calls and tokens; the search's own budgets
// refuse a model turn (AgentHost::Converse returns nullopt) and the agent
// stops cleanly.
// Not thread-safe; one AgentLoop per implementation, on one pool thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"
#include "evaluator/signature.h"
#include "llm/conversation.h"
#include "search/prompt_template.h"
#include "store/lineage_store.h"

namespace ks {

struct AgentLimits {
  int max_turns = 8;        // model turns per implementation
  int max_tool_calls = 12;  // tool calls per implementation (submit included)
  int64_t max_tokens = 0;   // tokens in + out per implementation; 0 = no limit
};

// What the loop needs from the search run that owns it.
class AgentHost {
 public:
  virtual ~AgentHost() = default;
  // One model turn under `slot`: the stored reply (a resumed search) or a new
  // call, stored. nullopt when refused (a search budget, the search stopping)
  // or failed (stored with its error). Errors: the store failing.
  virtual StatusOr<std::optional<AssistantReply>> Converse(const ConversationRequest& request,
                                                           const std::string& slot) = 0;
  // The practice evaluation of one candidate (never the judging sets).
  virtual StatusOr<Evaluation> Practice(const Candidate& candidate) = 0;
  // The candidate compiled and its plan resolved, not run (CandidateEvaluator::CompileOnly).
  virtual StatusOr<Evaluation> CompileOnly(const Candidate& candidate) = 0;
  // Its hardware counters, from one more verified practice run.
  virtual StatusOr<CounterReport> Profile(const Candidate& candidate) = 0;
  virtual StatusOr<std::vector<store::AttemptRow>> StoredAttempts(const std::string& slot) = 0;
  virtual Status StoreAttempt(const store::AttemptRow& attempt) = 0;
};

struct AgentTask {
  int64_t search_id = 0;
  std::optional<int64_t> idea_id;
  std::string slot;           // the implementation's slot ("r0/i3/b1")
  std::string system;         // the implement prompt's system part
  std::string prompt;         // the implement prompt
  const Signature* signature = nullptr;  // names a first wrong element by position; may be null
  AgentLimits limits;
  bool profile = false;       // offer the profile tool (the practice evaluator reads counters)
  // The agent's text (prompts/agent.md); null: PromptLibrary::LoadDefault(),
  // read once per RunAgent. Borrowed; outlives RunAgent.
  const PromptLibrary* prompts = nullptr;
};

// Why an agent's conversation ended.
enum class AgentStop {
  kSubmitted,  // the submit tool took a candidate
  kAnswered,   // a reply without tool calls (parsed as a one-shot reply)
  kTurns,      // AgentLimits::max_turns reached
  kToolCalls,  // AgentLimits::max_tool_calls reached
  kTokens,     // AgentLimits::max_tokens reached
  kRefused,    // the search's budget refused the next turn, or the turn failed
};
// "submitted", "answered", "turns", "tool calls", "tokens", "refused".
const char* AgentStopName(AgentStop stop);

struct AgentOutcome {
  // The candidate to judge: the one submitted or, when the agent ran out of
  // budget first, the last one that tested correct on practice sets.
  std::optional<Candidate> candidate;
  // The model's last text when it answered without tools (parsed as a
  // one-shot reply by the caller), else "".
  std::string final_text;
  bool submitted = false;
  AgentStop stop = AgentStop::kTurns;
  int turns = 0;
  int tool_calls = 0;
  int64_t tokens = 0;
};

// The sections of prompts/agent.md, each the template "agent.<section>":
// the instructions, the `source` argument's description, and per tool its
// description and its `plan` argument's ("<tool>_plan").
inline constexpr const char* kAgentSections[] = {"instructions", "source",      "compile", "compile_plan",
                                                 "test",         "test_plan",   "profile", "profile_plan",
                                                 "submit",       "submit_plan"};

// What the model sees in agent mode: the instructions appended to the
// implement prompt and the tools offered (profile only when `profile`).
struct AgentText {
  std::string instructions;
  std::vector<ToolSpec> tools;
};
// Renders every section of prompts/agent.md from `lib` (the profile tool's
// too when it is not offered, so that a broken template fails everywhere
// alike). Errors name the file and the section: one missing (NotFound), a
// placeholder the code does not set (InvalidArgument).
StatusOr<AgentText> RenderAgentText(const PromptLibrary& lib, const AgentLimits& limits, bool profile);
// The variables every section is rendered with: max_tool_calls, max_turns,
// max_tokens, and the lists profile_offered and token_limit (one empty record
// when true, none when false).
TemplateVars AgentTemplateVars(const AgentLimits& limits, bool profile);

StatusOr<AgentOutcome> RunAgent(const AgentTask& task, AgentHost* host);

// An implementation's attempts as `show`, `lineage` and the report show them:
// its tool calls in order and what the practice sets said of the candidate
// it ended with, beside what the judging sets said.
struct AgentTrail {
  std::vector<store::AttemptRow> attempts;  // empty: not an agent's candidate
  // The last practice test of exactly the judged source and plan, if any.
  std::string practice_status;              // "" when the candidate was never tested
  std::optional<double> practice_ms;
  std::string judged_status;                // "" while pending
  // Correct on practice sets but not when judged, or the other way round:
  // over-fitting to the practice sets shows here.
  bool disagrees() const {
    return !practice_status.empty() && !judged_status.empty() &&
           (practice_status == "correct") != (judged_status == "correct");
  }
};
StatusOr<AgentTrail> LoadAgentTrail(store::LineageStore* store, const store::CandidateRow& candidate);
// One line per tool call under `indent`, then the practice-vs-judging line.
std::string AgentTrailText(const AgentTrail& trail, const std::string& indent);
nlohmann::json AgentTrailJson(const AgentTrail& trail);

// What a tool answers for a practice evaluation (exposed for tests).
std::string CompileDigest(const Evaluation& e);
std::string TestDigest(const Evaluation& e, const Signature* sig);

}  // namespace ks
