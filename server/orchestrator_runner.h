// The production SearchRunner: runs a stored search through the Orchestrator
// with the server's model settings and evaluator. The problem's source comes
// from the store and is written to a private temporary file for the evaluator
// (the GPU evaluator loads problems from files).
//
// Ownership: borrows the store and the prompt library (must outlive it).
// Thread-safety: Run may be called for different searches at once; each call
// builds its own LLM client, evaluator and Orchestrator.
#pragma once

#include <optional>
#include <memory>
#include <string>

#include "evaluator/evaluator_api.h"
#include "search/evaluator_factory.h"
#include "llm/llm_factory.h"
#include "search/prompt_template.h"
#include "store/lineage_store.h"
#include "search/orchestrator.h"
#include "server/practice_calls.h"
#include "server/search_runner.h"
#include "server/temp_dir.h"

namespace ks::server {

// The evaluator spec of a server whose GPUs are `kernelsearch gpu-worker`
// processes elsewhere (Slurm jobs, pods): searches leave their candidates
// pending and the workers lease them (issue 13).
inline constexpr char kWorkersEvaluator[] = "workers";

struct OrchestratorRunnerOptions {
  EvaluatorOptions evaluator;  // spec: "" / "gpu", "workers", or "fake[:FILE]" for tests
  LlmConfig llm;               // knobs shared by every search; the spec is each search's model
  // With GPU workers: how an agent's tool calls wait for them (issue 32).
  PracticeCallOptions practice;
};

class OrchestratorRunner final : public SearchRunner {
 public:
  OrchestratorRunner(store::LineageStore* store, const PromptLibrary* prompts, OrchestratorRunnerOptions options);
  Status Run(int64_t search_id, const std::atomic<bool>* stop, const std::function<void()>& progress) override;
  // With GPU workers: the agents' practice calls, for the service to lease
  // (server/practice_calls.h); null otherwise. Owned here.
  PracticeCalls* practice_calls() const { return practice_calls_.get(); }

 private:
  Status RunWithWorkers(int64_t search_id, Orchestrator* orchestrator, const std::atomic<bool>* stop,
                        const std::function<void()>& progress);
  store::LineageStore* const store_;
  const PromptLibrary* const prompts_;
  const OrchestratorRunnerOptions options_;
  std::unique_ptr<PracticeCalls> practice_calls_;  // set when the evaluator is "workers"
};

// An evaluator for a stored problem: the source written to a private file that
// lives as long as the evaluator (every CandidateEvaluator method reaches it). FailedPrecondition when the spec cannot run
// here (no GPU). When `gpu` is given, it receives the device facts the
// evaluator measured (search/evaluator_factory.h), if any.
// When `degenerate` is given, it receives why the reference cannot judge
// kernels (SearchEvaluator::degenerate; empty: it can).
StatusOr<std::unique_ptr<CandidateEvaluator>> MakeStoredProblemEvaluator(const store::ProblemRow& problem,
                                                                         const EvaluatorOptions& options,
                                                                         std::optional<GpuFacts>* gpu = nullptr,
                                                                         std::vector<std::string>* degenerate = nullptr);

// A GPU worker's evaluators of one stored problem (server/gpu_worker.h): the
// judging one and, when asked for, the agents' practice one (issue 32), made
// as a search's GPU side makes them (search/search_setup.cc PrepareEvaluator):
// the GPU evaluator practises on sets of its own inside the judging reference
// (one GPU memory budget); an evaluator without them (the scripted one) gets a
// practice evaluator of its own (PracticeEvaluatorOptions: practice seed, no
// reference values). The problem's private file lives as long as both.
// Thread-compatible, like the evaluators.
class StoredProblemEvaluators {
 public:
  // `options` are the judging evaluator's (spec, device, precision, python).
  static StatusOr<std::unique_ptr<StoredProblemEvaluators>> Make(const store::ProblemRow& problem,
                                                                 const EvaluatorOptions& options, bool practice,
                                                                 std::optional<GpuFacts>* gpu = nullptr,
                                                                 std::vector<std::string>* degenerate = nullptr);
  StoredProblemEvaluators(const StoredProblemEvaluators&) = delete;
  StoredProblemEvaluators& operator=(const StoredProblemEvaluators&) = delete;
  ~StoredProblemEvaluators();

  CandidateEvaluator* judge() const { return judge_.get(); }
  CandidateEvaluator* practice() const { return practice_.get(); }  // null unless asked for

 private:
  StoredProblemEvaluators() = default;
  TempDir dir_;                                   // destroyed last
  std::unique_ptr<CandidateEvaluator> judge_;
  std::unique_ptr<CandidateEvaluator> practice_;  // destroyed first: it may be a view of judge_
};

}  // namespace ks::server
