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
#include "server/search_runner.h"

namespace ks::server {

// The evaluator spec of a server whose GPUs are `kernelsearch gpu-worker`
// processes elsewhere (Slurm jobs, pods): searches leave their candidates
// pending and the workers lease them (issue 13).
inline constexpr char kWorkersEvaluator[] = "workers";

struct OrchestratorRunnerOptions {
  EvaluatorOptions evaluator;  // spec: "" / "gpu", "workers", or "fake[:FILE]" for tests
  LlmConfig llm;               // knobs shared by every search; the spec is each search's model
};

class OrchestratorRunner final : public SearchRunner {
 public:
  OrchestratorRunner(store::LineageStore* store, const PromptLibrary* prompts, OrchestratorRunnerOptions options);
  Status Run(int64_t search_id, const std::atomic<bool>* stop, const std::function<void()>& progress) override;

 private:
  Status RunWithWorkers(int64_t search_id, Orchestrator* orchestrator, const std::atomic<bool>* stop,
                        const std::function<void()>& progress);
  store::LineageStore* const store_;
  const PromptLibrary* const prompts_;
  const OrchestratorRunnerOptions options_;
};

// An evaluator for a stored problem: the source written to a private file that
// lives as long as the evaluator. FailedPrecondition when the spec cannot run
// here (no GPU). When `gpu` is given, it receives the device facts the
// evaluator measured (search/evaluator_factory.h), if any.
// When `degenerate` is given, it receives why the reference cannot judge
// kernels (SearchEvaluator::degenerate; empty: it can).
StatusOr<std::unique_ptr<CandidateEvaluator>> MakeStoredProblemEvaluator(const store::ProblemRow& problem,
                                                                         const EvaluatorOptions& options,
                                                                         std::optional<GpuFacts>* gpu = nullptr,
                                                                         std::vector<std::string>* degenerate = nullptr);

}  // namespace ks::server
