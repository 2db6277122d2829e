#include "server/orchestrator_runner.h"

#include "common/files.h"
#include "search/orchestrator.h"
#include "search/search_config.h"
#include "server/temp_dir.h"

namespace ks::server {
namespace {

// Keeps the problem file alive exactly as long as the evaluator that reads it.
class StoredProblemEvaluator final : public CandidateEvaluator {
 public:
  StoredProblemEvaluator(TempDir dir, std::unique_ptr<CandidateEvaluator> inner)
      : dir_(std::move(dir)), inner_(std::move(inner)) {}
  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) override {
    return inner_->EvaluateBatch(candidates);
  }
  std::string DeviceName() const override { return inner_->DeviceName(); }

 private:
  TempDir dir_;  // destroyed after inner_ (declared first)
  std::unique_ptr<CandidateEvaluator> inner_;
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
                                                                         std::optional<GpuFacts>* gpu) {
  KS_ASSIGN_OR_RETURN(TempDir dir, TempDir::Make("ks-problem"));
  const std::string path = dir.path() + "/" + SafeStem(problem.name) + ".py";
  KS_RETURN_IF_ERROR(WriteFile(path, problem.source));
  KS_ASSIGN_OR_RETURN(SearchEvaluator made, MakeSearchEvaluator(path, options));
  if (gpu) *gpu = made.gpu;
  return std::unique_ptr<CandidateEvaluator>(new StoredProblemEvaluator(std::move(dir), std::move(made.evaluator)));
}

OrchestratorRunner::OrchestratorRunner(store::LineageStore* store, const PromptLibrary* prompts,
                                       OrchestratorRunnerOptions options)
    : store_(store), prompts_(prompts), options_(std::move(options)) {}

Status OrchestratorRunner::Run(int64_t search_id, const std::atomic<bool>* stop,
                               const std::function<void()>& progress) {
  KS_ASSIGN_OR_RETURN(store::SearchRow search, store_->GetSearch(search_id));
  KS_ASSIGN_OR_RETURN(store::ProblemRow problem, store_->GetProblem(search.problem_id));
  nlohmann::json cj = nlohmann::json::parse(search.config_json, nullptr, /*allow_exceptions=*/false);
  KS_ASSIGN_OR_RETURN(SearchConfig config, SearchConfigFromJson(cj));
  std::optional<GpuFacts> gpu;
  KS_ASSIGN_OR_RETURN(std::unique_ptr<CandidateEvaluator> evaluator,
                      MakeStoredProblemEvaluator(problem, options_.evaluator, &gpu));
  // What this server's GPU measured, for the prompts of this search (the
  // orchestrator reads it when the config holds no measured facts) and of
  // split searches that name this GPU.
  if (gpu) KS_RETURN_IF_ERROR(store_->PutGpuFacts(gpu->name, GpuFactsToJson(*gpu).dump(), search_id));
  LlmConfig llm_config = options_.llm;
  if (!config.model.empty()) llm_config.spec = config.model;
  llm_config.cancel = stop;  // a shutdown or cancel also aborts calls in flight
  llm_config.concurrency = config.llm_concurrency;
  KS_ASSIGN_OR_RETURN(std::unique_ptr<LlmClient> llm, MakeRoutedLlmClient(llm_config, config.role_models));
  Orchestrator::Deps deps;
  deps.store = store_;
  deps.llm = llm.get();
  deps.evaluator = evaluator.get();
  deps.prompts = prompts_;
  deps.cancel = stop;
  // Watchers read the store; an event only says "look now".
  Orchestrator orchestrator(deps, [&progress](const SearchEvent&) { progress(); });
  return orchestrator.Run(search_id).status();
}

}  // namespace ks::server
