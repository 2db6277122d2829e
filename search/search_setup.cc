#include "search/search_setup.h"

#include <filesystem>

#include <fmt/format.h>

#include "common/files.h"
#include "evaluator/problem.h"
#include "search/gpu_datasheet.h"
#include "search/orchestrator.h"
#include "store/candidate_hash.h"

namespace ks {
namespace fs = std::filesystem;

StatusOr<std::optional<GpuFacts>> GpuFactsForName(store::LineageStore* store, const std::string& name) {
  KS_ASSIGN_OR_RETURN(std::optional<std::string> measured, store->LatestGpuFacts(name));
  if (measured) {
    nlohmann::json j = nlohmann::json::parse(*measured, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      GpuFacts g = GpuFactsFromJson(j);
      g.name = name;
      return std::optional<GpuFacts>(g);
    }
  }
  return DatasheetGpuFacts(name);
}

Status CheckReferenceCanJudge(const std::string& problem, const std::vector<std::string>& degenerate,
                              const SearchConfig& config) {
  if (degenerate.empty() || config.allow_degenerate) return Status::Ok();
  std::string why;
  for (const auto& w : degenerate) why += "\n  - " + w;
  return InvalidArgument(problem + " has a degenerate reference; its outputs cannot tell a correct kernel from a "
                                   "wrong one:" + why + "\n(pass --allow-degenerate to search anyway)");
}

StatusOr<std::string> StoredProblemFile(const store::ProblemRow& problem, const std::string& path) {
  for (const std::string& candidate : {path, problem.file_path}) {
    if (candidate.empty()) continue;
    auto text = ReadFile(candidate);
    if (text.ok() && Sha256Hex(*text) == problem.sha256) return candidate;
  }
  std::string dir = (fs::temp_directory_path() / ("kernelsearch-problems-" + problem.sha256.substr(0, 16))).string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FailedPrecondition("creating " + dir + ": " + ec.message());
  // The stem is the problem's name, which the bridge reports as the signature's name.
  std::string stem;
  for (char c : problem.name) stem += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  std::string copy = dir + "/" + (stem.empty() ? "problem" : stem.substr(0, 64)) + ".py";
  KS_RETURN_IF_ERROR(WriteFile(copy, problem.source));
  return copy;
}

StatusOr<std::unique_ptr<LlmClient>> MakeSearchModel(const SearchConfig& config, LlmConfig base) {
  if (!config.model.empty()) base.spec = config.model;
  if (base.spec.empty()) return InvalidArgument("no model: pass --model SPEC (or set \"model\" in the config)");
  base.concurrency = config.llm_concurrency;
  return MakeRoutedLlmClient(base, config.role_models);
}

Status SearchSetup::MakeModel() {
  KS_ASSIGN_OR_RETURN(llm_, MakeSearchModel(config_, options_.llm));
  return Status::Ok();
}

StatusOr<std::unique_ptr<SearchSetup>> SearchSetup::Create(store::LineageStore* store,
                                                           const NewSearchRequest& request, SetupOptions options) {
  std::unique_ptr<SearchSetup> s(new SearchSetup(store, std::move(options)));
  s->config_ = request.config;
  KS_RETURN_IF_ERROR(s->config_.Validate());
  // The model client is made first: a malformed spec or a missing key must
  // fail before anything is written.
  if (s->options_.need_model) KS_RETURN_IF_ERROR(s->MakeModel());
  std::string source = request.problem_source;
  if (source.empty()) {
    KS_ASSIGN_OR_RETURN(source, ReadFile(request.problem_file));
  }
  Signature sig;
  if (request.signature) {
    sig = *request.signature;
  } else {
    // Shapes only: the model side never runs the problem on data (a
    // KernelBench problem's forward may need more memory than this machine has).
    s->Phase("reading the problem's signature (shapes on the meta device, nothing computed)");
    if (s->options_.load_signature) {
      KS_ASSIGN_OR_RETURN(sig, s->options_.load_signature(request.problem_file));
    } else {
      KS_ASSIGN_OR_RETURN(sig, LoadProblemSignature(request.problem_file, BridgeOptions{.python = request.python}));
    }
  }
  if (!request.gpu_name.empty()) {
    KS_ASSIGN_OR_RETURN(std::optional<GpuFacts> facts, GpuFactsForName(store, request.gpu_name));
    if (facts) {
      s->config_.gpu = *facts;
      if (facts->from_datasheet())
        s->notes_.push_back("GPU '" + request.gpu_name +
                            "': the prompts state its datasheet figures until a GPU node has measured it");
    } else {
      s->config_.gpu = GpuFacts{};
      s->notes_.push_back("no measured facts and no datasheet entry for GPU '" + request.gpu_name + "' in " +
                          store->path() + ": the prompts say its figures are unknown until `kernelsearch "
                          "evaluate-pending` on that GPU has measured them");
    }
    s->config_.gpu.name = request.gpu_name;
  }
  KS_ASSIGN_OR_RETURN(s->search_id_, Orchestrator::CreateSearch(store, request.problem_file, source, sig, s->config_));
  s->problem_file_ = request.problem_file;
  return s;
}

StatusOr<std::unique_ptr<SearchSetup>> SearchSetup::Open(store::LineageStore* store, int64_t search_id,
                                                         SetupOptions options, const std::string& model,
                                                         const std::string& problem_path) {
  std::unique_ptr<SearchSetup> s(new SearchSetup(store, std::move(options)));
  KS_ASSIGN_OR_RETURN(store::SearchRow search, store->GetSearch(search_id));
  if (search.status == store::SearchStatus::kFailed && search.stop_reason.rfind(kReferenceRefusal, 0) == 0)
    return FailedPrecondition("search " + std::to_string(search_id) + " stopped on its GPU side: " +
                              search.stop_reason.substr(std::string(kReferenceRefusal).size()) +
                              "\n(change the problem and start a new search)");
  nlohmann::json cj = nlohmann::json::parse(search.config_json, nullptr, /*allow_exceptions=*/false);
  auto config = SearchConfigFromJson(cj);
  if (!config.ok()) return config.status().WithContext("search " + std::to_string(search_id) + " config");
  s->config_ = std::move(config).value();
  if (!model.empty()) s->config_.model = model;
  s->search_id_ = search_id;
  if (s->options_.need_model) KS_RETURN_IF_ERROR(s->MakeModel());
  KS_ASSIGN_OR_RETURN(store::ProblemRow problem, store->GetProblem(search.problem_id));
  KS_ASSIGN_OR_RETURN(s->problem_file_, StoredProblemFile(problem, problem_path));
  return s;
}

std::string RoundsChange::Describe(int64_t search_id) const {
  const std::string id = std::to_string(search_id);
  if (reopened)
    return after == before + 1
               ? fmt::format("search {} ran its {} rounds; running round {} ({} in all)", id, before, after, after)
               : fmt::format("search {} ran its {} rounds; running rounds {} to {} ({} in all)", id, before,
                             before + 1, after, after);
  if (after == before) return fmt::format("search {}: {} rounds in all, as before", id, after);
  return fmt::format("search {}: {} rounds in all (was {})", id, after, before);
}

StatusOr<RoundsChange> PlanSearchRounds(const store::SearchRow& search, int rounds) {
  const std::string id = std::to_string(search.id);
  if (search.status == store::SearchStatus::kFailed && search.stop_reason.rfind(kReferenceRefusal, 0) == 0)
    return FailedPrecondition("search " + id + " stopped on its GPU side: " +
                              search.stop_reason.substr(std::string(kReferenceRefusal).size()) +
                              "\n(change the problem and start a new search)");
  nlohmann::json cj = nlohmann::json::parse(search.config_json, nullptr, /*allow_exceptions=*/false);
  auto config = SearchConfigFromJson(cj);
  if (!config.ok()) return config.status().WithContext("search " + id + " config");
  RoundsChange change{.before = config->rounds, .after = rounds};
  if (search.status == store::SearchStatus::kFinished) {
    if (search.stop_reason != kStopRounds)
      return FailedPrecondition("search " + id + " finished: " + search.stop_reason +
                                "; more rounds would stop at once for the same reason (budgets and the target "
                                "hold across resumes): start a new search to go on");
    if (rounds <= config->rounds)
      return InvalidArgument(fmt::format("search {} ran its {} rounds already; the rounds given are the new total "
                                         "(after round 0): give more than {} to add rounds ({} runs round {})",
                                         id, config->rounds, config->rounds, config->rounds + 1, config->rounds + 1));
    change.reopened = true;
  }
  config->rounds = rounds;
  KS_RETURN_IF_ERROR(config->Validate().WithContext("search " + id));
  return change;
}

StatusOr<RoundsChange> SetSearchRounds(store::LineageStore* store, int64_t search_id, int rounds) {
  KS_ASSIGN_OR_RETURN(store::SearchRow search, store->GetSearch(search_id));
  KS_ASSIGN_OR_RETURN(RoundsChange change, PlanSearchRounds(search, rounds));
  SearchConfig config = *SearchConfigFromJson(nlohmann::json::parse(search.config_json, nullptr, false));
  config.rounds = rounds;
  KS_RETURN_IF_ERROR(store->SetSearchConfig(search_id, SearchConfigToJson(config).dump()));
  // Pending, not finished: a resume without rounds now goes on too, and a
  // server that restarts picks it up.
  if (change.reopened) KS_RETURN_IF_ERROR(store->SetSearchStatus(search_id, store::SearchStatus::kPending, ""));
  return change;
}

std::string FinishedSearchNote(const store::SearchRow& search, const SearchConfig& config,
                               const std::string& command) {
  if (search.status != store::SearchStatus::kFinished) return "";
  auto fill = [&](int total) {
    std::string out = command;
    for (auto [key, value] : {std::pair<std::string, std::string>{"{id}", std::to_string(search.id)},
                              {"{rounds}", std::to_string(total)}})
      for (size_t at; (at = out.find(key)) != std::string::npos;) out.replace(at, key.size(), value);
    return out;
  };
  if (search.stop_reason != kStopRounds)
    return fmt::format("search {} is finished ({}); nothing to resume, and more rounds would stop at once for the "
                       "same reason: start a new search to go on",
                       search.id, search.stop_reason.empty() ? "no reason recorded" : search.stop_reason);
  return fmt::format("search {} is finished: it ran its {} rounds; nothing to resume. To add rounds, give the new "
                     "total: `{}` runs round {}",
                     search.id, config.rounds, fill(config.rounds + 1), config.rounds + 1);
}

Status SearchSetup::MakePracticeEvaluator(EvaluatorOptions eo) {
  Phase("preparing the agent's practice reference (other input sets than the judging ones)");
  eo = PracticeEvaluatorOptions(std::move(eo));
  auto made = options_.make_evaluator ? options_.make_evaluator(problem_file_) : MakeSearchEvaluator(problem_file_, eo);
  if (!made.ok()) return made.status().WithContext("the agent's practice evaluator");
  practice_evaluator_ = std::move(made->evaluator);
  return Status::Ok();
}

Status SearchSetup::PrepareEvaluator() {
  Phase("preparing the reference on the GPU side (reused once cached; a first time computes it and times PyTorch)");
  auto refuse = [&](const Status& why) -> Status {
    KS_RETURN_IF_ERROR(
        store_->SetSearchStatus(search_id_, store::SearchStatus::kFailed, kReferenceRefusal + why.message()));
    return why;
  };
  EvaluatorOptions eo = options_.evaluator;
  eo.precision = config_.precision;  // the search's contract, whoever evaluates it
  // An agent practises on sets of its own inside the judging evaluator: one
  // GPU memory budget, one worker (GpuEvaluator::EvaluatePractice).
  if (config_.implement == ImplementMode::kAgent) eo.practice_sets = 1;
  auto made = options_.make_evaluator ? options_.make_evaluator(problem_file_) : MakeSearchEvaluator(problem_file_, eo);
  if (!made.ok()) {
    // The problem's own fault (a nondeterministic forward, get_inputs
    // raising) ends the search; a machine without a GPU does not.
    if (made.status().code() == Code::kInvalidArgument) return refuse(made.status());
    return made.status();
  }
  if (Status judge = CheckReferenceCanJudge(problem_file_, made->degenerate, config_); !judge.ok())
    return refuse(judge);
  evaluator_ = std::move(made->evaluator);
  measured_gpu_ = made->gpu;
  practice_evaluator_ = std::move(made->practice);
  if (config_.implement == ImplementMode::kAgent && !practice_evaluator_) {  // a scripted evaluator: one of its own
    eo.practice_sets = 0;
    KS_RETURN_IF_ERROR(MakePracticeEvaluator(eo));
  }
  // What this GPU measured, for the prompts of this search and of split
  // searches that name this GPU (the orchestrator reads it from the store).
  if (!measured_gpu_) return Status::Ok();
  KS_RETURN_IF_ERROR(store_->PutGpuFacts(measured_gpu_->name, GpuFactsToJson(*measured_gpu_).dump(), search_id_));
  // Measured figures replace datasheet or unknown ones in the config, under
  // the name the user gave (--gpu), if any.
  const GpuFacts& had = config_.gpu;
  if (had.sm_count > 0 && had.memory_bandwidth_gbps > 0 && !had.from_datasheet()) return Status::Ok();
  std::string name = had.name;
  config_.gpu = *measured_gpu_;
  if (!name.empty()) config_.gpu.name = name;
  return store_->SetSearchConfig(search_id_, SearchConfigToJson(config_).dump());
}

}  // namespace ks
