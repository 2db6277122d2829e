// kernelsearch search / evaluate-pending: running a search (continuous, resumed,
// or the model side of a split search) and evaluating what a split search left
// pending. The lineage store is $KS_DB, else ~/.local/share/kernelsearch/lineage.db
// (XDG_DATA_HOME respected); --db overrides.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/llm_flags.h"
#include "common/files.h"
#include "evaluator/compile/candidate_parser.h"
#include "evaluator/problem.h"
#include "search/evaluator_factory.h"
#include "search/orchestrator.h"
#include "search/search_config.h"
#include "search/search_setup.h"
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
  std::string require;  // --require robust
  Contract precision = Contract::kHighest;  // --precision (evaluator/judge/judge.h)
  std::string implement;           // --implement oneshot | agent (search/agent.h)
  int agent_turns = 0, agent_tool_calls = 0;
  int64_t agent_tokens = 0;
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

// A rewritten line ("\r" and an erase) only makes sense on a terminal; in a
// log it is noise: there, each event is a line of its own and the live status
// line (rewritten many times a second) is left out.
bool StderrIsTerminal() {
  static const bool tty = isatty(STDERR_FILENO) == 1;
  return tty;
}
const char* Rewrite() { return StderrIsTerminal() ? "\r\033[K" : ""; }

// "round 3"; events before a search's first round have none to name.
std::string RoundLabel(int round) { return round >= 0 ? fmt::format("round {}", round) : "before round 0"; }

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
      std::fprintf(stderr, "%s%s%lld model call%s failed; first error: %s\n", Rewrite(),
                   step_round_ >= 0 ? fmt::format("round {}: ", step_round_).c_str() : "",
                   static_cast<long long>(step_failed_), step_failed_ == 1 ? "" : "s", step_first_error_.c_str());
      step_failed_ = 0;
      step_first_error_.clear();
    }
    if (e.type == SearchEvent::Type::kRoundStarted) step_round_ = e.round;
    if (e.type == SearchEvent::Type::kNote && !json_) std::fprintf(stderr, "\r\033[Knote: %s\n", e.text.c_str());
    if (quiet_ || json_) return;
    std::string best = e.best_speedup ? fmt::format("{:.2f}x", *e.best_speedup) : "-";
    std::string line = fmt::format("{} | evaluated {} ({} failed) | best {} | {} calls, ${:.2f}",
                                   RoundLabel(e.round), e.evaluated, e.failed, best, e.llm_calls, e.cost_usd);
    if (e.type == SearchEvent::Type::kRoundStarted || e.type == SearchEvent::Type::kNewBest ||
        e.type == SearchEvent::Type::kFinished) {
      std::string what = e.type == SearchEvent::Type::kRoundStarted ? "round " + std::to_string(e.round) + " started"
                         : e.type == SearchEvent::Type::kNewBest
                             ? fmt::format("new best: candidate {} ({:.2f}x)", e.candidate_id, e.speedup.value_or(0))
                             : "finished: " + e.text;
      std::fprintf(stderr, "%s%s\n", Rewrite(), what.c_str());
    }
    if (StderrIsTerminal()) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      if (e.type == SearchEvent::Type::kFinished) std::fprintf(stderr, "\n");
    } else if (e.type == SearchEvent::Type::kFinished) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

 private:
  bool quiet_, json_;
  int step_round_ = -1;        // the round the current step works on
  int64_t step_failed_ = 0;    // failed model calls in it
  std::string step_first_error_;
};

// What every model client of a search shares (keys, timeouts, prices, the
// transcript, the interrupt); the spec and the per-role specs come from the
// search's config (search/search_setup.h).
LlmConfig BaseLlmConfig(const LlmFlags& flags) {
  LlmConfig c = flags.config;
  if (flags.temperature >= 0) c.temperature = flags.temperature;
  if (flags.max_tokens > 0) c.max_tokens = flags.max_tokens;
  c.cancel = &g_interrupted;
  return c;
}

// A slow phase says what it is doing, on stderr, unless --quiet or --json.
std::function<void(const std::string&)> PhasePrinter(bool quiet, bool json) {
  if (quiet || json) return nullptr;
  return [](const std::string& what) {
    std::fprintf(stderr, "%s...\n", what.c_str());
    std::fflush(stderr);
  };
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
  if (sub->count("--implement")) {
    auto mode = ParseImplementMode(f.implement);
    if (!mode.ok()) return mode.status().WithContext("--implement");
    config.implement = *mode;
  }
  if (sub->count("--agent-turns")) config.agent_turns = f.agent_turns;
  if (sub->count("--agent-tool-calls")) config.agent_tool_calls = f.agent_tool_calls;
  if (sub->count("--agent-tokens")) config.agent_tokens = f.agent_tokens;
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
  if (f.allow_degenerate) config.allow_degenerate = true;
  if (sub->count("--precision")) config.precision = f.precision;
  if (f.require == "robust") config.require_robust = true;
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
    // A search that ends without a kernel says so in its last line.
    if (out.status == store::SearchStatus::kFailed)
      std::printf("no correct kernel: the search failed; resume it with `kernelsearch search --resume %lld` "
                  "(--model SPEC to change the model)\n",
                  static_cast<long long>(out.search_id));
    else if (out.status == store::SearchStatus::kFinished && !out.best_candidate)
      std::printf("no correct kernel found (`kernelsearch show` of a candidate says why it failed)\n");
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
  if (out.status == store::SearchStatus::kFailed) return kExitFailed;
  return kExitOk;
}

// The outcome of a search as the store holds it, for a resume that runs nothing.
StatusOr<SearchOutcome> StoredOutcome(store::LineageStore* store, const store::SearchRow& search) {
  SearchOutcome out;
  out.search_id = search.id;
  out.status = search.status;
  out.stop_reason = search.stop_reason;
  out.total_elapsed_s = search.elapsed_s;
  KS_ASSIGN_OR_RETURN(auto best, store->BestCorrect(search.id));
  if (best) {
    out.best_candidate = best->id;
    if (best->evaluation) out.best_speedup = best->evaluation->speedup_eager;
  }
  KS_ASSIGN_OR_RETURN(auto pending, store->PendingCandidates(search.id));
  out.pending = static_cast<int64_t>(pending.size());
  return out;
}

// The GPU side's options of the flags (search/evaluator_factory.h, the builder
// every command uses); a search judges under its config's contract
// (SearchSetup::PrepareEvaluator), which --precision sets.
StatusOr<EvaluatorOptions> SearchEvaluatorOptions(const SearchFlags& f) {
  EvaluatorOptions eo{.spec = f.evaluator, .python = f.python, .device = 0, .gpus = f.gpus};
  eo.precision = f.precision;
  return eo;
}

int RunSearch(SearchFlags& f, CLI::App* sub) {
  auto store = store::LineageStore::Open(DbPath(f.db));
  if (!store.ok()) return ReportError(store.status());
  SetupOptions so;
  auto eo = SearchEvaluatorOptions(f);
  if (!eo.ok()) return ReportError(eo.status());
  so.evaluator = *eo;
  so.llm = BaseLlmConfig(f.llm);
  so.on_phase = PhasePrinter(f.quiet, f.json);
  const bool fake = f.evaluator == "fake" || f.evaluator.rfind("fake:", 0) == 0;
  // A finished search resumed without --rounds has nothing to do: say so, and
  // how to add rounds, before anything is prepared.
  if (f.resume && !sub->count("--rounds")) {
    auto search = (*store)->GetSearch(f.resume);
    if (!search.ok()) return ReportError(search.status());
    if (search->status == store::SearchStatus::kFinished) {
      auto config = SearchConfigFromJson(nlohmann::json::parse(search->config_json, nullptr, false));
      if (!config.ok()) return ReportError(config.status().WithContext("search " + std::to_string(f.resume)));
      std::fprintf(stderr, "kernelsearch: %s\n",
                   FinishedSearchNote(*search, *config, "kernelsearch search --resume {id} --rounds {rounds}").c_str());
      auto out = StoredOutcome(store->get(), *search);
      if (!out.ok()) return ReportError(out.status());
      return PrintOutcome(*out, f.json);
    }
  }
  // Without a GPU a continuous search cannot evaluate: say so before anything
  // is written (the model side of a split search needs none).
  if (!f.generate_only && !fake) {
    std::string why;
    if (!GpuAvailable(&why))
      return ReportError(FailedPrecondition(
          "this search needs a GPU to evaluate candidates (" + why +
          "); run the model side here with --generate-only [--gpu NAME] and `kernelsearch evaluate-pending` "
          "on a GPU node, or try the tool with --evaluator fake"));
  }
  std::unique_ptr<SearchSetup> setup;
  if (f.resume) {
    // --rounds on a resume is the search's new total (a finished search goes
    // on from its beam); the rest of the tree's shape stays as stored.
    if (sub->count("--rounds")) {
      auto change = SetSearchRounds(store->get(), f.resume, f.rounds);
      if (!change.ok()) return ReportError(change.status());
      std::fprintf(stderr, "kernelsearch: %s\n", change->Describe(f.resume).c_str());
    }
    // A different model may be named for the rest of a resumed search (a key
    // changed, a server moved, a model failed).
    auto opened = SearchSetup::Open(store->get(), f.resume, so, sub->count("--model") ? f.llm.config.spec : "");
    if (!opened.ok()) return ReportError(opened.status());
    setup = std::move(*opened);
  } else {
    if (f.problem.empty()) return ReportError(InvalidArgument("search: give a PROBLEM file or --resume ID"));
    if (std::filesystem::is_directory(f.problem))
      return ReportError(InvalidArgument(f.problem + " is a directory: search many problems with `kernelsearch suite " +
                                         f.problem + "`"));
    auto config = ConfigFromFlags(f, sub);
    if (!config.ok()) return ReportError(config.status());
    NewSearchRequest request{.problem_file = f.problem, .config = *config, .gpu_name = f.gpu_name, .python = f.python};
    if (!f.signature_file.empty()) {
      auto text = ReadFile(f.signature_file);
      if (!text.ok()) return ReportError(text.status());
      auto parsed = SignatureFromJson(nlohmann::json::parse(*text, nullptr, false));
      if (!parsed.ok()) return ReportError(parsed.status().WithContext(f.signature_file));
      request.signature = *parsed;
    }
    auto created = SearchSetup::Create(store->get(), request, so);
    if (!created.ok()) return ReportError(created.status());
    setup = std::move(*created);
    if (!f.quiet && !f.json)
      std::fprintf(stderr, "search %lld (resume with --resume %lld)\n", static_cast<long long>(setup->search_id()),
                   static_cast<long long>(setup->search_id()));
  }
  SearchSetup& s = *setup;
  // An agent tests its drafts on the GPU between model turns: the model side
  // alone cannot run it (run the search where both are reachable).
  if (f.generate_only && s.config().implement == ImplementMode::kAgent)
    return ReportError(FailedPrecondition(
        "search " + std::to_string(s.search_id()) + " implements with an agent (--implement agent), whose compile "
        "and test tools need the GPU side: run it without --generate-only on a GPU node, or submit it to "
        "`kernelsearch serve --evaluator workers`, whose `kernelsearch gpu-worker` processes serve the tools"));
  // Said even with --quiet: what the prompts will claim about the GPU matters.
  for (const auto& note : s.notes()) std::fprintf(stderr, "kernelsearch: %s\n", note.c_str());
  // The GPU side: the reference is computed (or reused) and checked before
  // anything is spent on the model; a reference that cannot judge kernels
  // stops the search here, recorded as failed with the reason.
  if (!f.generate_only) {
    Status st = s.PrepareEvaluator();
    if (!st.ok()) return ReportError(st.WithContext("search " + std::to_string(s.search_id())));
  }
  auto prompts = PromptLibrary::LoadDefault();
  if (!prompts.ok()) return ReportError(prompts.status());
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  Progress progress(f.quiet, f.json);
  Orchestrator orch({.store = store->get(), .llm = s.llm(), .evaluator = s.evaluator(), .prompts = &*prompts,
                     .cancel = &g_interrupted, .practice_evaluator = s.practice_evaluator()},
                    [&](const SearchEvent& e) { progress(e); });
  auto out = orch.Run(s.search_id(), f.generate_only ? Orchestrator::Mode::kGenerateOnly : Orchestrator::Mode::kContinuous);
  if (!out.ok()) return ReportError(out.status().WithContext("search " + std::to_string(s.search_id())));
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
          std::fprintf(stderr, "%s[%d/%d] %s: preparing%s", Rewrite(), e.index + 1, e.count, e.problem.c_str(),
                       StderrIsTerminal() ? "" : "\n");
          std::fflush(stderr);
        }
        return;
      case SuiteEvent::Type::kSearchProgress: {
        if (json_ || quiet_ || !e.search || !StderrIsTerminal()) return;
        const SearchEvent& s = *e.search;
        std::string best = s.best_speedup ? fmt::format("{:.2f}x", *s.best_speedup) : "-";
        std::fprintf(stderr, "\r\033[K[%d/%d] %s: %s | evaluated %lld (%lld failed) | best %s | %lld calls",
                     e.index + 1, e.count, e.problem.c_str(), RoundLabel(s.round).c_str(), static_cast<long long>(s.evaluated),
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
          if (!quiet_) std::fprintf(stderr, "%s", Rewrite());
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
  auto llm = MakeSearchModel(config, BaseLlmConfig(f.llm));
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

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  SuiteProgress progress(f.quiet, f.json);
  auto eo = SearchEvaluatorOptions(f);
  if (!eo.ok()) return ReportError(eo.status());
  SuiteRunner runner({.store = store->get(), .llm = llm->get(), .prompts = &*prompts, .cancel = &g_interrupted,
                      .evaluator = *eo},
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
  int refused = 0;
  for (const auto& [search_id, n] : per_search) {
    SetupOptions so;
    so.evaluator = {.spec = f.evaluator, .python = f.python, .device = 0, .gpus = f.gpus};
    so.need_model = false;
    so.on_phase = PhasePrinter(f.quiet, f.json);
    auto setup = SearchSetup::Open(store->get(), search_id, so);
    Status st = setup.ok() ? (*setup)->PrepareEvaluator() : setup.status();
    if (!st.ok()) {
      // The problem's fault (a reference that cannot judge kernels) stops
      // that search, recorded as failed; the other searches go on. Anything
      // else (no GPU, no torch) stops here.
      const bool problems_fault =
          st.code() == Code::kInvalidArgument || (!setup.ok() && st.code() == Code::kFailedPrecondition);
      if (!problems_fault) return ReportError(st.WithContext("search " + std::to_string(search_id)));
      ReportError(st.WithContext("search " + std::to_string(search_id)));
      ++refused;
      continue;
    }
    Orchestrator orch({.store = store->get(), .evaluator = (*setup)->evaluator(), .cancel = &g_interrupted},
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
  return refused > 0 ? kExitUsage : kExitOk;
}

// The options a single search and a suite share: the search's shape, budgets,
// models, store, evaluator.
void AddSharedSearchOptions(CLI::App* sub, SearchFlags* f) {
  sub->add_option("--config", f->config_file, "JSON config file (keys as in search_config.h); flags override it");
  sub->add_option("--rounds", f->rounds,
                  "improvement rounds after round 0 (default 3); with `search --resume`, the search's new total: "
                  "a finished search of 3 rounds given --rounds 5 runs rounds 4 and 5");
  sub->add_option("--ideas", f->ideas, "ideas per beam kernel per round (default 4)");
  sub->add_option("--branches", f->branches, "implementations per idea (default 2)");
  sub->add_option("--beam", f->beam, "kernels carried into the next round (default 2)");
  sub->add_option("--repair", f->repair, "repair attempts for a failed candidate (default 1)");
  sub->add_option("--implement", f->implement,
                  "oneshot (default): one reply per implementation; agent: a conversation in which the model "
                  "compiles and tests its drafts on practice input sets before it submits (needs the GPU side)")
      ->check(CLI::IsMember({"oneshot", "agent"}));
  sub->add_option("--agent-turns", f->agent_turns, "agent: model turns per implementation (default 8)");
  sub->add_option("--agent-tool-calls", f->agent_tool_calls, "agent: tool calls per implementation (default 12)");
  sub->add_option("--agent-tokens", f->agent_tokens, "agent: tokens per implementation (default 0 = no limit)");
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
  sub->add_option("--require", f->require,
                  "robust: a kernel that only holds for get_inputs()'s distribution (specialised) counts as incorrect")
      ->check(CLI::IsMember({"robust"}));
  AddPrecisionOption(sub, &f->precision);
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
  sub->add_option("--resume", f->resume,
                  "continue search ID from the store with its stored shape; a finished search goes on only "
                  "with --rounds N, its new total of rounds");
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
