// The interface the search uses to evaluate candidates, so that the search can be
// tested with a fake. The real implementation is GpuEvaluator (gpu_evaluator.h).
#pragma once

#include <string>
#include <vector>

#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"
#include "evaluator/signature.h"

namespace ks {

class CandidateEvaluator {
 public:
  virtual ~CandidateEvaluator() = default;
  // Evaluates a batch; returns one Evaluation per candidate, in order. Compiles
  // may run in parallel; GPU work is serialized per GPU. A failing candidate is
  // an Evaluation, never a Status; a Status is for the evaluator itself failing
  // (no GPU, the reference could not be computed).
  virtual StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) = 0;
  // Compiles one candidate and resolves its plan, without running it (the
  // agent's `compile` tool, search/agent.h): compile_error or invalid_plan,
  // else the compile fields (target, log, resources, launches) with status
  // kCorrect and the message "compiled; not run". Nothing is judged by it.
  // This default evaluates it in full (an evaluator with no cheaper way).
  virtual StatusOr<Evaluation> CompileOnly(const Candidate& candidate) {
    KS_ASSIGN_OR_RETURN(std::vector<Evaluation> out, EvaluateBatch({candidate}));
    if (out.size() != 1) return Internal("the evaluator returned " + std::to_string(out.size()) + " results for one");
    return std::move(out.front());
  }
  // Hardware counters of each candidate's launches (evaluator/profile/counters.h), one
  // report per candidate. An evaluator that cannot read them says so in each
  // report's note; the search goes on either way.
  virtual std::vector<CounterReport> ReadCounters(const std::vector<Candidate>& candidates) {
    return std::vector<CounterReport>(candidates.size(), CounterReport{{}, "this evaluator reads no hardware counters", 0});
  }
  // Whether ReadCounters can return counters here at all (Nsight Compute
  // found): the agent offers its `profile` tool only then (search/agent.h).
  virtual bool CanReadCounters() const { return false; }
  // The reference timing and device facts, for prompts and reports.
  virtual std::string DeviceName() const = 0;
};

}  // namespace ks
