// kernelsearch search / evaluate-pending: running a search (continuous, resumed,
// or the model side of a split search) and evaluating what a split search left
// pending. The lineage store is $KS_DB, else ~/.local/share/kernelsearch/lineage.db
// (XDG_DATA_HOME respected); --db overrides.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/llm_flags.h"
#include "common/files.h"
#include "evaluator/candidate_parser.h"
#include "evaluator/problem.h"
#include "search/evaluator_factory.h"
#include "search/orchestrator.h"
#include "search/search_config.h"
#include "search/suite.h"
#include "evaluator/cuda_driver.h"
#include "store/lineage_store.h"

namespace ks::cli {
namespace {

// SIGINT/SIGTERM stop the search cleanly (it stays resumable); a second one
// kills the process the default way.
std::atomic<bool> g_interrupted{false};
void OnSignal(int sig) {
  g_interrupted.store(true);
  std::signal(sig, SIG_DFL);
}

struct SearchFlags {
  std::string problem;
  std::string config_file;
  int rounds = 0, ideas = 0, branches = 0, beam = 0, repair = 0, profile_top = 0;
  int64_t budget_calls = 0;
  double budget_cost = 0, budget_minutes = 0, target_speedup = 0;
  int64_t budget_tokens = 0;
  std::string ideas_model, implement_model, repair_model;
  std::string seed_kernel, seed_plan;
  uint64_t seed = 42;
  std::string db;
  int64_t resume = 0;
  bool generate_only = false;
  bool allow_degenerate = false;
  bool no_bank = false;
  bool quiet = false;
  bool json = false;
  std::string evaluator;
  std::string gpus;  // --gpus: "" = GPU 0; "all" or "0,1" (search/evaluator_pool.h)
  std::string python;
  std::string signature_file;
  std::string gpu_name;
  LlmFlags llm;
  // kernelsearch suite only.
  std::vector<std::string> paths;
  int64_t show = 0;
};

std::string DbPath(const std::string& flag) { return flag.empty() ? store::DefaultDbPath() : flag; }

// Live progress: one rewritten line on stderr for people, JSON lines on stdout
// for scripts.
class Progress {
 public:
  Progress(bool quiet, bool json) : quiet_(quiet), json_(json) {}
  void operator()(const SearchEvent& e) {
    if (json_) {
      std::printf("%s\n", SearchEventToJson(e).dump().c_str());
      std::fflush(stdout);
    }
    if (e.type == SearchEvent::Type::kLlmCall && !e.error.empty()) {
      if (step_failed_++ == 0) step_first_error_ = e.error;
    }
    // A step whose model calls failed says so when it ends, whatever --quiet
    // says: a search that silently finds nothing is the worst outcome.
    if ((e.type == SearchEvent::Type::kRoundStarted || e.type == SearchEvent::Type::kFinished) && step_failed_ > 0) {
      std::fprintf(stderr, "\r\033[K%s%lld model call%s failed; first error: %s\n",
                   step_round_ >= 0 ? fmt::format("round {}: ", step_round_).c_str() : "",
                   static_cast<long long>(step_failed_), step_failed_ == 1 ? "" : "s", step_first_error_.c_str());
      step_failed_ = 0;
      step_first_error_.clear();
    }
    if (e.type == SearchEvent::Type::kRoundStarted) step_round_ = e.round;
    if (e.type == SearchEvent::Type::kNote && !json_) std::fprintf(stderr, "\r\033[Knote: %s\n", e.text.c_str());
    if (quiet_ || json_) return;
    std::string best = e.best_speedup ? fmt::format("{:.2f}x", *e.best_speedup) : "-";
    std::string line = fmt::format("round {} | evaluated {} ({} failed) | best {} | {} calls, ${:.2f}",
                                   e.round, e.evaluated, e.failed, best, e.llm_calls, e.cost_usd);
    if (e.type == SearchEvent::Type::kRoundStarted || e.type == SearchEvent::Type::kNewBest ||
        e.type == SearchEvent::Type::kFinished) {
      std::string what = e.type == SearchEvent::Type::kRoundStarted ? "round " + std::to_string(e.round) + " started"
                         : e.type == SearchEvent::Type::kNewBest
                             ? fmt::format("new best: candidate {} ({:.2f}x)", e.candidate_id, e.speedup.value_or(0))
                             : "finished: " + e.text;
      std::fprintf(stderr, "\r\033[K%s\n", what.c_str());
    }
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    if (e.type == SearchEvent::Type::kFinished) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool quiet_, json_;
  int step_round_ = -1;        // the round the current step works on
  int64_t step_failed_ = 0;    // failed model calls in it
  std::string step_first_error_;
};

StatusOr<std::unique_ptr<LlmClient>> MakeClient(const SearchFlags& f, const SearchConfig& config) {
  LlmFlags flags = f.llm;
  flags.config.spec = config.model;
  flags.config.cancel = &g_interrupted;
  flags.role_models.clear();
  for (const auto& [role, spec] : config.role_models) flags.role_models.push_back(role + "=" + spec);
  if (flags.config.spec.empty()) return InvalidArgument("no model: pass --model SPEC (or set \"model\" in --config)");
  return MakeLlmClientFromFlags(flags);
}

// The search config the flags describe: --config's file, then the flags given.
StatusOr<SearchConfig> ConfigFromFlags(const SearchFlags& f, CLI::App* sub) {
  SearchConfig config;
  if (!f.config_file.empty()) {
    auto c = LoadSearchConfigFile(f.config_file, config);
    if (!c.ok()) return c.status();
    config = *c;
  }
  // Flags given on the command line override the file.
  if (sub->count("--rounds")) config.rounds = f.rounds;
  if (sub->count("--ideas")) config.ideas = f.ideas;
  if (sub->count("--branches")) config.branches = f.branches;
  if (sub->count("--beam")) config.beam = f.beam;
  if (sub->count("--repair")) config.repair_attempts = f.repair;
  if (sub->count("--profile-top")) config.profile_top = f.profile_top;
  if (sub->count("--budget-calls")) config.budget_calls = f.budget_calls;
  if (sub->count("--budget-tokens")) config.budget_tokens = f.budget_tokens;
  if (sub->count("--budget-cost")) config.budget_cost_usd = f.budget_cost;
  if (sub->count("--budget-minutes")) config.budget_minutes = f.budget_minutes;
  if (sub->count("--target-speedup")) config.target_speedup = f.target_speedup;
  if (sub->count("--seed")) config.seed = f.seed;
  if (sub->count("--model")) config.model = f.llm.config.spec;
  if (sub->count("--concurrency")) config.llm_concurrency = f.llm.config.concurrency;
  if (!f.ideas_model.empty()) config.role_models["ideas"] = f.ideas_model;
  if (!f.implement_model.empty()) config.role_models["implement"] = f.implement_model;
  if (!f.repair_model.empty()) config.role_models["repair"] = f.repair_model;
  for (const auto& rs : f.llm.role_models) {
    auto parsed = ParseRoleSpec(rs);
    if (!parsed.ok()) return parsed.status();
    config.role_models[parsed->first] = parsed->second;
  }
  if (!f.seed_kernel.empty()) {
    auto seed = LoadCandidateFiles(f.seed_kernel, f.seed_plan);
    if (!seed.ok()) return seed.status().WithContext("--seed-kernel");
    config.seed_source = seed->source;
    config.seed_plan = seed->plan_json;
    config.seed_label = f.seed_kernel;
  }
  if (!f.gpu_name.empty()) config.gpu.name = f.gpu_name;
  if (f.no_bank) config.bank = false;
  KS_RETURN_IF_ERROR(config.Validate());
  return config;
}

int PrintOutcome(const SearchOutcome& out, bool json) {
  if (json) {
    nlohmann::json j = {{"event", "outcome"},
                        {"search", out.search_id},
                        {"status", store::SearchStatusName(out.status)},
                        {"stop_reason", out.stop_reason},
                        {"pending", out.pending},
                        {"evaluated_now", out.evaluated_now},
                        {"llm_calls_now", out.llm_calls_now},
                        {"llm_calls_reused", out.llm_calls_reused},
                        {"llm_failed_now", out.llm_failed_now},
                        {"elapsed_s", out.total_elapsed_s}};
    if (out.best_candidate) j["best_candidate"] = *out.best_candidate;
    if (out.best_speedup) j["best_speedup"] = *out.best_speedup;
    if (!out.first_llm_error.empty()) j["first_llm_error"] = out.first_llm_error;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("search %lld: %s%s\n", static_cast<long long>(out.search_id), store::SearchStatusName(out.status),
                out.stop_reason.empty() ? "" : (" (" + out.stop_reason + ")").c_str());
    if (out.best_candidate)
      std::printf("best: candidate %lld, %.2fx over eager (kernelsearch show %lld)\n",
                  static_cast<long long>(*out.best_candidate), out.best_speedup.value_or(0),
                  static_cast<long long>(*out.best_candidate));
    if (out.pending > 0)
      std::printf("%lld candidates pending: run `kernelsearch evaluate-pending` where the GPU is\n",
                  static_cast<long long>(out.pending));
  }
  if (out.status == store::SearchStatus::kCancelled) return kExitEnv;
  // Model calls were made, every one failed and nothing came of this run: the
  // model cannot be reached or refuses us (an environment problem, exit 3).
  if (out.llm_failed_now > 0 && out.llm_failed_now == out.llm_calls_now && out.evaluated_now == 0 &&
      !out.best_candidate) {
    std::fprintf(stderr, "kernelsearch: every model call failed (%lld); first error: %s\n",
                 static_cast<long long>(out.llm_failed_now), out.first_llm_error.c_str());
    return kExitEnv;
  }
  return kExitOk;
}

int RunSearch(SearchFlags& f, CLI::App* sub) {
  auto store = store::LineageStore::Open(DbPath(f.db));
  if (!store.ok()) return ReportError(store.status());
  int64_t search_id = f.resume;
  std::string problem_file;
  SearchConfig config;
  if (f.resume) {
    auto search = (*store)->GetSearch(f.resume);
    if (!search.ok()) return ReportError(search.status());
    auto c = SearchConfigFromJson(nlohmann::json::parse(search->config_json, nullptr, false));
    if (!c.ok()) return ReportError(c.status());
    config = *c;
    auto problem = (*store)->GetProblem(search->problem_id);
    if (!problem.ok()) return ReportError(problem.status());
    auto file = StoredProblemFile(*problem);
    if (!file.ok()) return ReportError(file.status());
    problem_file = *file;
    // A different model may be named for the rest of a resumed search (a key
    // changed, a server moved); the tree's shape stays as stored.
    if (sub->count("--model")) config.model = f.llm.config.spec;
  } else {
    if (f.problem.empty()) return ReportError(InvalidArgument("search: give a PROBLEM file or --resume ID"));
    problem_file = f.problem;
    if (std::filesystem::is_directory(problem_file))
      return ReportError(InvalidArgument(problem_file + " is a directory: search many problems with `kernelsearch suite " +
                                         problem_file + "`"));
    auto c = ConfigFromFlags(f, sub);
    if (!c.ok()) return ReportError(c.status());
    config = *c;
  }

  // A degenerate reference (outputs all zero, constant, independent of the
  // input, or NaN) cannot tell a right kernel from a wrong one: refuse it
  // unless the user says otherwise. Without torch here (--signature), the GPU
  // node's evaluator still warns when it prepares the reference.
  if (!f.resume && f.signature_file.empty() && !f.allow_degenerate) {
    auto warnings = CheckProblem(problem_file, BridgeOptions{.python = f.python});
    if (!warnings.ok()) return ReportError(warnings.status());
    if (!warnings->empty()) {
      std::string why;
      for (const auto& w : *warnings) why += "\n  - " + w;
      return ReportError(InvalidArgument(problem_file + " has a degenerate reference; its outputs cannot tell a "
                                            "correct kernel from a wrong one:" + why +
                                            "\n(pass --allow-degenerate to search anyway)"));
    }
  }

  // The evaluator first: a search that cannot evaluate must fail before it
  // spends anything on the model.
  std::unique_ptr<CandidateEvaluator> evaluator;
  std::optional<GpuFacts> measured_gpu;
  if (!f.generate_only) {
    auto made = MakeSearchEvaluator(problem_file,
                                    {.spec = f.evaluator, .python = f.python, .device = 0, .gpus = f.gpus});
    if (!made.ok()) return ReportError(made.status());
    evaluator = std::move(made->evaluator);
    // What the prompts say about the GPU is fixed when the search is created:
    // the evaluator's measured facts, with --gpu naming it differently.
    if (!f.resume && made->gpu) {
      config.gpu = *made->gpu;
      if (!f.gpu_name.empty()) config.gpu.name = f.gpu_name;
    }
    if (!f.resume && config.gpu.name.empty()) config.gpu.name = evaluator->DeviceName();
    measured_gpu = made->gpu;
  } else if (!f.resume && !f.gpu_name.empty()) {
    // The model side of a split search: the facts a GPU node of that name
    // measured, if one ever reported to this store.
    auto facts = (*store)->LatestGpuFacts(f.gpu_name);
    if (!facts.ok()) return ReportError(facts.status());
    nlohmann::json j = *facts ? nlohmann::json::parse(**facts, nullptr, false) : nlohmann::json();
    if (j.is_object()) {
      config.gpu = GpuFactsFromJson(j);
      config.gpu.name = f.gpu_name;
    } else {
      std::fprintf(stderr,
                   "kernelsearch: no device facts for GPU '%s' in %s yet: prompts say its figures are unknown "
                   "until `kernelsearch evaluate-pending` on that GPU has measured them\n",
                   f.gpu_name.c_str(), (*store)->path().c_str());
    }
  }
  auto llm = MakeClient(f, config);
  if (!llm.ok()) return ReportError(llm.status());
  auto prompts = PromptLibrary::LoadDefault();
  if (!prompts.ok()) return ReportError(prompts.status());

  if (!f.resume) {
    auto source = ReadFile(problem_file);
    if (!source.ok()) return ReportError(source.status());
    Signature sig;
    if (!f.signature_file.empty()) {
      auto text = ReadFile(f.signature_file);
      if (!text.ok()) return ReportError(text.status());
      auto parsed = SignatureFromJson(nlohmann::json::parse(*text, nullptr, false));
      if (!parsed.ok()) return ReportError(parsed.status().WithContext(f.signature_file));
      sig = *parsed;
    } else {
      auto loaded = LoadProblemSignature(problem_file, BridgeOptions{.python = f.python});
      if (!loaded.ok()) return ReportError(loaded.status());
      sig = *loaded;
    }
    auto id = Orchestrator::CreateSearch(store->get(), problem_file, *source, sig, config);
    if (!id.ok()) return ReportError(id.status());
    search_id = *id;
    if (!f.quiet && !f.json) std::fprintf(stderr, "search %lld (resume with --resume %lld)\n",
                                          static_cast<long long>(search_id), static_cast<long long>(search_id));
  }

  if (measured_gpu) {
    Status st = (*store)->PutGpuFacts(measured_gpu->name, GpuFactsToJson(*measured_gpu).dump(), search_id);
    if (!st.ok()) return ReportError(st);
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  Progress progress(f.quiet, f.json);
  Orchestrator orch({.store = store->get(), .llm = llm->get(), .evaluator = evaluator.get(),
                     .prompts = &*prompts, .cancel = &g_interrupted},
                    [&](const SearchEvent& e) { progress(e); });
  auto out = orch.Run(search_id, f.generate_only ? Orchestrator::Mode::kGenerateOnly : Orchestrator::Mode::kContinuous);
  if (!out.ok()) return ReportError(out.status().WithContext("search " + std::to_string(search_id)));
  return PrintOutcome(*out, f.json);
}

// Live progress of a suite: the table's rows on stdout as problems finish, and
// one rewritten line on stderr for the problem being searched; JSON lines on
// stdout for scripts.
class SuiteProgress {
 public:
  SuiteProgress(bool quiet, bool json) : quiet_(quiet), json_(json) {}
  void operator()(const SuiteEvent& e) {
    switch (e.type) {
      case SuiteEvent::Type::kProblemStarted:
        if (json_) {
          Print(nlohmann::json{{"event", "problem_started"}, {"index", e.index}, {"problem", e.problem}});
        } else if (!quiet_) {
          Header();
          std::fprintf(stderr, "\r\033[K[%d/%d] %s: preparing", e.index + 1, e.count, e.problem.c_str());
          std::fflush(stderr);
        }
        return;
      case SuiteEvent::Type::kSearchProgress: {
        if (json_ || quiet_ || !e.search) return;
        const SearchEvent& s = *e.search;
        std::string best = s.best_speedup ? fmt::format("{:.2f}x", *s.best_speedup) : "-";
        std::fprintf(stderr, "\r\033[K[%d/%d] %s: round %d | evaluated %lld (%lld failed) | best %s | %lld calls",
                     e.index + 1, e.count, e.problem.c_str(), s.round, static_cast<long long>(s.evaluated),
                     static_cast<long long>(s.failed), best.c_str(), static_cast<long long>(s.llm_calls));
        std::fflush(stderr);
        return;
      }
      case SuiteEvent::Type::kProblemFinished:
        if (json_) {
          auto j = SuiteProblemResultToJson(e.result);
          j["event"] = "problem";
          j["index"] = e.index;
          j["resumed_done"] = e.skipped;
          Print(j);
        } else {
          Header();
          if (!quiet_) std::fprintf(stderr, "\r\033[K");
          std::fflush(stderr);
          std::printf("%s", RenderSuiteRow(e.index, e.result).c_str());
          std::fflush(stdout);
        }
        return;
    }
  }

 private:
  void Print(const nlohmann::json& j) {
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  void Header() {
    if (header_done_) return;
    header_done_ = true;
    std::printf("%s", RenderSuiteHeader().c_str());
  }
  bool quiet_, json_;
  bool header_done_ = false;
};

int PrintSuiteReport(const SuiteReport& report, bool json, bool with_rows) {
  if (json) {
    std::printf("%s\n", SuiteReportToJson(report).dump().c_str());
  } else {
    if (with_rows) std::printf("%s", RenderSuiteReport(report).c_str());
    else std::printf("%s", RenderSuiteFigures(report.figures).c_str());
    std::printf("suite %lld: %s\n", static_cast<long long>(report.suite_id), report.status.c_str());
  }
  return report.status == "cancelled" ? kExitEnv : kExitOk;
}

int RunSuite(SearchFlags& f, CLI::App* sub) {
  auto store = store::LineageStore::Open(DbPath(f.db));
  if (!store.ok()) return ReportError(store.status());
  if (f.show) {
    auto report = LoadSuiteReport(store->get(), f.show);
    if (!report.ok()) return ReportError(report.status());
    PrintSuiteReport(*report, f.json, /*with_rows=*/true);
    return kExitOk;  // showing a cancelled suite is not itself a failure
  }
  int64_t suite_id = f.resume;
  SearchConfig config;
  std::vector<std::string> files;
  if (f.resume) {
    auto suite = (*store)->GetSuite(f.resume);
    if (!suite.ok()) return ReportError(suite.status());
    if (!f.paths.empty()) return ReportError(InvalidArgument("suite --resume takes no problem paths: the suite has its own"));
    auto c = SuiteSearchConfig(*suite);
    if (!c.ok()) return ReportError(c.status());
    config = *c;
    if (sub->count("--model")) config.model = f.llm.config.spec;
  } else {
    if (f.paths.empty()) return ReportError(InvalidArgument("suite: give problem files or directories, or --resume ID"));
    auto listed = ListProblemFiles(f.paths);
    if (!listed.ok()) return ReportError(listed.status());
    files = *listed;
    auto c = ConfigFromFlags(f, sub);
    if (!c.ok()) return ReportError(c.status());
    config = *c;
  }
  // Without a GPU every problem would fail the same way: say so once, at once.
  if (f.evaluator.empty() || f.evaluator == "gpu") {
    std::string why;
    if (!GpuAvailable(&why)) return ReportError(FailedPrecondition("a suite needs a GPU to evaluate candidates: " + why));
  }
  auto llm = MakeClient(f, config);
  if (!llm.ok()) return ReportError(llm.status());
  auto prompts = PromptLibrary::LoadDefault();
  if (!prompts.ok()) return ReportError(prompts.status());
  if (!f.resume) {
    auto id = SuiteRunner::Create(store->get(), files, config);
    if (!id.ok()) return ReportError(id.status());
    suite_id = *id;
  }
  if (!f.json) std::fprintf(stderr, "suite %lld (resume with `kernelsearch suite --resume %lld`)\n",
                            static_cast<long long>(suite_id), static_cast<long long>(suite_id));

  BridgeOptions bridge{.python = f.python};
  SuiteRunner::Hooks hooks;
  hooks.signature = [&](const std::string& file) -> StatusOr<Signature> {
    // As a single search: a degenerate reference cannot tell a right kernel from a wrong one.
    if (!f.allow_degenerate) {
      KS_ASSIGN_OR_RETURN(std::vector<std::string> warnings, CheckProblem(file, bridge));
      if (!warnings.empty()) {
        std::string why;
        for (const auto& w : warnings) why += (why.empty() ? "" : "; ") + w;
        return InvalidArgument("degenerate reference (" + why + "); --allow-degenerate to search anyway");
      }
    }
    return LoadProblemSignature(file, bridge);
  };
  hooks.evaluator = [&](const std::string& file) {
    return MakeSearchEvaluator(file, {.spec = f.evaluator, .python = f.python, .device = 0, .gpus = f.gpus});
  };
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  SuiteProgress progress(f.quiet, f.json);
  SuiteRunner runner({.store = store->get(), .llm = llm->get(), .prompts = &*prompts, .cancel = &g_interrupted,
                      .hooks = hooks},
                     [&](const SuiteEvent& e) { progress(e); });
  auto report = runner.Run(suite_id);
  if (!report.ok()) return ReportError(report.status().WithContext("suite " + std::to_string(suite_id)));
  return PrintSuiteReport(*report, f.json, /*with_rows=*/false);
}

struct EvaluatePendingFlags {
  std::string db;
  int64_t search = 0;
  std::string evaluator;
  std::string gpus;  // --gpus: "" = GPU 0; "all" or "0,1" (search/evaluator_pool.h)
  std::string python;
  bool quiet = false;
  bool json = false;
};

int RunEvaluatePending(const EvaluatePendingFlags& f) {
  auto store = store::LineageStore::Open(DbPath(f.db));
  if (!store.ok()) return ReportError(store.status());
  auto pending = (*store)->PendingCandidates(f.search);
  if (!pending.ok()) return ReportError(pending.status());
  std::map<int64_t, int> per_search;
  for (const auto& c : *pending) per_search[c.search_id]++;
  if (per_search.empty()) {
    if (f.json) std::printf("{\"event\":\"outcome\",\"evaluated\":0}\n");
    else std::printf("nothing pending\n");
    return kExitOk;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  Progress progress(f.quiet, f.json);
  int64_t total = 0;
  for (const auto& [search_id, n] : per_search) {
    auto search = (*store)->GetSearch(search_id);
    if (!search.ok()) return ReportError(search.status());
    auto problem = (*store)->GetProblem(search->problem_id);
    if (!problem.ok()) return ReportError(problem.status());
    auto file = StoredProblemFile(*problem);
    if (!file.ok()) return ReportError(file.status());
    auto made =
        MakeSearchEvaluator(*file, {.spec = f.evaluator, .python = f.python, .device = 0, .gpus = f.gpus});
    if (!made.ok()) return ReportError(made.status());
    // What this GPU node measured goes into the store, so that the model side
    // tells the model true figures (search --generate-only --resume / --gpu NAME).
    if (made->gpu) {
      Status st = (*store)->PutGpuFacts(made->gpu->name, GpuFactsToJson(*made->gpu).dump(), search_id);
      if (!st.ok()) return ReportError(st);
    }
    Orchestrator orch({.store = store->get(), .evaluator = made->evaluator.get(), .cancel = &g_interrupted},
                      [&](const SearchEvent& e) { progress(e); });
    auto out = orch.EvaluatePending(search_id);
    if (!out.ok()) return ReportError(out.status().WithContext("search " + std::to_string(search_id)));
    total += out->evaluated_now;
    if (f.json) {
      std::printf("%s\n", nlohmann::json({{"event", "outcome"}, {"search", search_id},
                                          {"evaluated_now", out->evaluated_now}})
                              .dump()
                              .c_str());
    } else if (!f.quiet) {
      std::fprintf(stderr, "\n");
      std::printf("search %lld: evaluated %lld; continue with `kernelsearch search --generate-only --resume %lld`\n",
                  static_cast<long long>(search_id), static_cast<long long>(out->evaluated_now),
                  static_cast<long long>(search_id));
    }
  }
  return kExitOk;
}

// The options a single search and a suite share: the search's shape, budgets,
// models, store, evaluator.
void AddSharedSearchOptions(CLI::App* sub, SearchFlags* f) {
  sub->add_option("--config", f->config_file, "JSON config file (keys as in search_config.h); flags override it");
  sub->add_option("--rounds", f->rounds, "improvement rounds after round 0 (default 3)");
  sub->add_option("--ideas", f->ideas, "ideas per beam kernel per round (default 4)");
  sub->add_option("--branches", f->branches, "implementations per idea (default 2)");
  sub->add_option("--beam", f->beam, "kernels carried into the next round (default 2)");
  sub->add_option("--repair", f->repair, "repair attempts for a failed candidate (default 1)");
  sub->add_option("--profile-top", f->profile_top,
                  "read the hardware counters (Nsight Compute) of this many fastest correct kernels per round, "
                  "for the next round's prompts (default 1; 0 = none)");
  sub->add_option("--budget-calls", f->budget_calls, "stop after this many model calls");
  sub->add_option("--budget-tokens", f->budget_tokens, "stop after this many tokens");
  sub->add_option("--budget-cost", f->budget_cost, "stop after this much model spend (USD)");
  sub->add_option("--budget-minutes", f->budget_minutes, "stop after this many minutes of wall time (summed over resumes)");
  sub->add_option("--target-speedup", f->target_speedup, "stop once a kernel is this much faster than eager");
  sub->add_option("--ideas-model", f->ideas_model, "model SPEC for the ideas prompt");
  sub->add_option("--implement-model", f->implement_model, "model SPEC for the implement prompt");
  sub->add_option("--repair-model", f->repair_model, "model SPEC for the repair prompt");
  sub->add_option("--seed", f->seed, "seed for reproducible tie-breaking");
  sub->add_option("--db", f->db, "lineage store (default $KS_DB or ~/.local/share/kernelsearch/lineage.db)");
  sub->add_flag("--allow-degenerate", f->allow_degenerate,
                "search even when the problem's reference outputs are degenerate (see `kernelsearch problem check`)");
  sub->add_flag("--no-bank", f->no_bank,
                "do not show the model the best kernels of similar problems from the store (the kernel bank)");
  sub->add_flag("--quiet", f->quiet, "no live progress");
  sub->add_option("--evaluator", f->evaluator, "gpu (default), or fake[:FILE] for tests (scripted_evaluator.h)");
  AddGpusOption(sub, &f->gpus);
  AddPythonOption(sub, &f->python);
  sub->add_option("--gpu", f->gpu_name, "the GPU the prompts name (default: the evaluator's device)");
  AddLlmOptions(sub, &f->llm, /*require_model=*/false);
}

}  // namespace

void RegisterSearchCommands(CLI::App& app) {
  auto* f = new SearchFlags();  // lives as long as the process: CLI11 binds to it
  auto* sub = app.add_subcommand("search", "search for fast kernels for a problem (multi-round, with lineage)");
  sub->add_option("problem", f->problem, "the problem .py (KernelBench format); many problems: `kernelsearch suite`");
  sub->add_option("--seed-kernel", f->seed_kernel, "a first kernel (.cu with .json plan beside it, or .md)");
  sub->add_option("--seed-plan", f->seed_plan, "the seed kernel's plan, when not beside it");
  sub->add_option("--resume", f->resume, "continue search ID from the store");
  sub->add_flag("--generate-only", f->generate_only,
                "run the model side of the next step, leave candidates pending (for GPU nodes without internet)");
  sub->add_flag("--json", f->json, "events and the outcome as JSON lines on stdout");
  sub->add_option("--signature", f->signature_file,
                  "the problem's signature as JSON instead of running the bridge (machines without torch)");
  AddSharedSearchOptions(sub, f);
  SetAction(sub, [f, sub] { return RunSearch(*f, sub); });

  auto* f_suite = new SearchFlags();
  auto* su = app.add_subcommand("suite",
                                "search many problems (a directory, e.g. a KernelBench level) in one resumable run, "
                                "with the per-problem table and fast_p figures");
  su->add_option("problems", f_suite->paths, "problem .py files and/or directories of them");
  su->add_option("--resume", f_suite->resume, "continue suite ID from the store");
  su->add_option("--show", f_suite->show, "print suite ID's table and figures from the store, and run nothing");
  su->add_flag("--json", f_suite->json, "one JSON line per problem as it finishes, then the suite's table and figures");
  AddSharedSearchOptions(su, f_suite);
  su->footer("Exit status: 0 the suite ran to its end (problems without a correct kernel are rows, not errors), "
             "2 bad arguments, 3 no GPU / cancelled.");
  SetAction(su, [f_suite, su] { return RunSuite(*f_suite, su); });

  auto* ef = new EvaluatePendingFlags();
  auto* ep = app.add_subcommand("evaluate-pending", "evaluate every pending candidate in the store (split searches)");
  ep->add_option("--db", ef->db, "lineage store (default $KS_DB or ~/.local/share/kernelsearch/lineage.db)");
  ep->add_option("--search", ef->search, "only this search");
  ep->add_option("--evaluator", ef->evaluator, "gpu (default), or fake[:FILE] for tests");
  AddGpusOption(ep, &ef->gpus);
  AddPythonOption(ep, &ef->python);
  ep->add_flag("--quiet", ef->quiet, "no live progress");
  ep->add_flag("--json", ef->json, "JSON lines on stdout");
  SetAction(ep, [ef] { return RunEvaluatePending(*ef); });
}

}  // namespace ks::cli
