#include "server/orchestrator_runner.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/files.h"
#include "search/orchestrator.h"
#include "search/search_config.h"
#include "search/search_setup.h"
#include "server/temp_dir.h"

namespace ks::server {
namespace {

// The judging evaluator of a stored problem, with its private file (both
// owned by `evaluators`, which lives as long as it).
class StoredProblemEvaluator final : public CandidateEvaluator {
 public:
  explicit StoredProblemEvaluator(std::unique_ptr<StoredProblemEvaluators> evaluators)
      : evaluators_(std::move(evaluators)), inner_(evaluators_->judge()) {}
  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) override {
    return inner_->EvaluateBatch(candidates);
  }
  StatusOr<Evaluation> CompileOnly(const Candidate& candidate) override { return inner_->CompileOnly(candidate); }
  std::vector<CounterReport> ReadCounters(const std::vector<Candidate>& candidates) override {
    return inner_->ReadCounters(candidates);
  }
  bool CanReadCounters() const override { return inner_->CanReadCounters(); }
  std::string DeviceName() const override { return inner_->DeviceName(); }

 private:
  const std::unique_ptr<StoredProblemEvaluators> evaluators_;
  CandidateEvaluator* const inner_;  // evaluators_->judge()
};

std::string SafeStem(const std::string& name) {
  std::string out;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  return out.empty() ? "problem" : out.substr(0, 64);
}

}  // namespace

StatusOr<std::unique_ptr<CandidateEvaluator>> MakeStoredProblemEvaluator(const store::ProblemRow& problem,
                                                                         const EvaluatorOptions& options,
                                                                         std::optional<GpuFacts>* gpu,
                                                                         std::vector<std::string>* degenerate) {
  KS_ASSIGN_OR_RETURN(std::unique_ptr<StoredProblemEvaluators> made,
                      StoredProblemEvaluators::Make(problem, options, /*practice=*/false, gpu, degenerate));
  return std::unique_ptr<CandidateEvaluator>(new StoredProblemEvaluator(std::move(made)));
}

StatusOr<std::unique_ptr<StoredProblemEvaluators>> StoredProblemEvaluators::Make(
    const store::ProblemRow& problem, const EvaluatorOptions& options, bool practice, std::optional<GpuFacts>* gpu,
    std::vector<std::string>* degenerate) {
  std::unique_ptr<StoredProblemEvaluators> out(new StoredProblemEvaluators());
  KS_ASSIGN_OR_RETURN(out->dir_, TempDir::Make("ks-problem"));
  const std::string path = out->dir_.path() + "/" + SafeStem(problem.name) + ".py";
  KS_RETURN_IF_ERROR(WriteFile(path, problem.source));
  EvaluatorOptions eo = options;
  eo.practice_sets = practice ? 1 : 0;
  KS_ASSIGN_OR_RETURN(SearchEvaluator made, MakeSearchEvaluator(path, eo));
  if (gpu) *gpu = made.gpu;
  if (degenerate) *degenerate = made.degenerate;
  out->judge_ = std::move(made.evaluator);
  out->practice_ = std::move(made.practice);
  if (practice && !out->practice_) {
    eo.practice_sets = 0;
    KS_ASSIGN_OR_RETURN(SearchEvaluator own, MakeSearchEvaluator(path, PracticeEvaluatorOptions(eo)));
    out->practice_ = std::move(own.evaluator);
  }
  return out;
}

StoredProblemEvaluators::~StoredProblemEvaluators() {
  practice_.reset();  // a view of judge_'s practice sets, where it is one
  judge_.reset();
}

OrchestratorRunner::OrchestratorRunner(store::LineageStore* store, const PromptLibrary* prompts,
                                       OrchestratorRunnerOptions options)
    : store_(store), prompts_(prompts), options_(std::move(options)) {
  if (options_.evaluator.spec == kWorkersEvaluator)
    practice_calls_ = std::make_unique<PracticeCalls>(store_, options_.practice);
}

// GPU workers evaluate (issue 13): the model side runs one generate-only step
// at a time and, between steps, waits until the workers (kernelsearch
// gpu-worker, through the lease RPCs) have evaluated what the step left
// pending; the next step selects the beam from their results and generates
// the repairs and the next round.
Status OrchestratorRunner::RunWithWorkers(int64_t search_id, Orchestrator* orchestrator, const std::atomic<bool>* stop,
                                          const std::function<void()>& progress) {
  using namespace std::chrono_literals;
  int idle_steps = 0;
  for (;;) {
    KS_ASSIGN_OR_RETURN(SearchOutcome out, orchestrator->Run(search_id, Orchestrator::Mode::kGenerateOnly));
    if (stop->load() || out.status != store::SearchStatus::kRunning) return Status::Ok();
    // A step that left nothing to evaluate (its model calls failed): try again
    // after a pause; the call budget ends a search whose model keeps failing.
    if (out.pending == 0) {
      std::this_thread::sleep_for(std::min(10, ++idle_steps) * 1s);
      continue;
    }
    idle_steps = 0;
    int64_t last = -1;
    for (;;) {
      if (stop->load()) return Status::Ok();
      auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      KS_ASSIGN_OR_RETURN(auto pending, store_->PendingAndLeased(search_id, now));
      if (pending.first == 0) break;
      // A worker refused to judge (a degenerate reference): the search failed with its reason.
      KS_ASSIGN_OR_RETURN(store::SearchRow row, store_->GetSearch(search_id));
      if (row.status == store::SearchStatus::kFailed) return FailedPrecondition(row.stop_reason);
      if (pending.first != last) progress();
      last = pending.first;
      std::this_thread::sleep_for(200ms);
    }
    progress();
  }
}

Status OrchestratorRunner::Run(int64_t search_id, const std::atomic<bool>* stop,
                               const std::function<void()>& progress) {
  // Set up as every search is (search/search_setup.h): the server refuses
  // what the CLI refuses.
  const bool workers = options_.evaluator.spec == kWorkersEvaluator;
  SetupOptions so;
  so.evaluator = options_.evaluator;
  so.llm = options_.llm;
  so.llm.cancel = stop;  // a shutdown or cancel also aborts calls in flight
  KS_ASSIGN_OR_RETURN(std::unique_ptr<SearchSetup> setup, SearchSetup::Open(store_, search_id, so));
  // This server's GPU computes and checks the reference before any model call;
  // with GPU workers, they do (and the orchestrator leaves candidates pending).
  if (!workers) KS_RETURN_IF_ERROR(setup->PrepareEvaluator());
  Orchestrator::Deps deps;
  deps.store = store_;
  deps.llm = setup->llm();
  deps.evaluator = setup->evaluator();
  deps.practice_evaluator = setup->practice_evaluator();
  // With GPU workers, the agent's conversations run here, beside the model, and
  // each of its tool calls is leased to a worker (issue 32).
  std::unique_ptr<CandidateEvaluator> practice;
  if (workers && setup->config().implement == ImplementMode::kAgent) {
    practice = practice_calls_->EvaluatorFor(search_id, stop);
    deps.practice_evaluator = practice.get();
  }
  deps.prompts = prompts_;
  deps.cancel = stop;
  // Watchers read the store; an event only says "look now".
  Orchestrator orchestrator(deps, [&progress](const SearchEvent&) { progress(); });
  if (workers) return RunWithWorkers(search_id, &orchestrator, stop, progress);
  return orchestrator.Run(search_id).status();
}

}  // namespace ks::server
