// Browsing the lineage store: history, best, show, lineage, export. Tables for
// people; --json for scripts.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/eval_format.h"
#include "common/files.h"
#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"
#include "evaluator/profile/launch_profile.h"
#include "evaluator/profile/roofline.h"
#include "search/agent.h"
#include "search/export.h"
#include "store/lineage_store.h"

namespace ks::cli {
namespace {

// The precision contract a search's speedups are under (evaluator/judge/judge.h).
std::string ContractOf(const std::string& config_json) {
  auto c = nlohmann::json::parse(config_json, nullptr, false);
  std::string p = c.is_object() ? c.value("precision", std::string()) : std::string();
  return CanonicalContract(p.empty() ? "highest" : p);
}

using store::CandidateRow;

// KS_ASSIGN_OR_RETURN for command bodies: an error becomes the exit code.
#define KS_ASSIGN_OR_RETURN_CLI(lhs, expr) KS_ASSIGN_OR_RETURN_CLI_IMPL(KS_CONCAT(ks_cli_, __LINE__), lhs, expr)
#define KS_ASSIGN_OR_RETURN_CLI_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return ReportError(tmp.status());   \
  lhs = std::move(tmp).value()

struct BrowseFlags {
  std::string db;
  bool json = false;
  std::string problem;
  int64_t id = 0;
  std::string out_dir;
  std::string arch = "sm_90a";
  bool allow_specialised = false;
};

StatusOr<std::unique_ptr<store::LineageStore>> OpenStore(const BrowseFlags& f) {
  store::LineageStore::Options o;
  o.must_exist = true;
  return store::LineageStore::Open(f.db.empty() ? store::DefaultDbPath() : f.db, o);
}

// Rounds as --rounds counts them: improvement rounds after round 0, done/asked.
std::string RoundsText(const store::SearchSummary& s) {
  auto config = nlohmann::json::parse(s.search.config_json, nullptr, false);
  int asked = config.is_object() ? config.value("rounds", 0) : 0;
  return fmt::format("{}/{}", std::max(0, s.rounds - 1), asked);
}

std::string Opt(const std::optional<double>& v, const char* fmt_spec) {
  return v ? fmt::format(fmt::runtime(fmt_spec), *v) : "-";
}

nlohmann::json CandidateJson(const CandidateRow& c, bool with_code) {
  nlohmann::json j = {{"id", c.id},           {"search", c.search_id},
                      {"round", c.round},     {"kind", store::CandidateKindName(c.kind)},
                      {"branch", c.branch},   {"repair_depth", c.repair_depth},
                      {"content_hash", c.content_hash}, {"state", c.evaluated ? "evaluated" : "pending"},
                      {"created", c.created}};
  j["idea"] = c.idea_id ? nlohmann::json(*c.idea_id) : nlohmann::json();
  j["parent"] = c.parent_candidate ? nlohmann::json(*c.parent_candidate) : nlohmann::json();
  if (c.evaluation) {
    j["status"] = EvalStatusName(c.evaluation->status);
    j["median_ms"] = c.evaluation->median_ms ? nlohmann::json(*c.evaluation->median_ms) : nlohmann::json();
    j["speedup_eager"] = c.evaluation->speedup_eager ? nlohmann::json(*c.evaluation->speedup_eager) : nlohmann::json();
    j["speedup_compile"] =
        c.evaluation->speedup_compile ? nlohmann::json(*c.evaluation->speedup_compile) : nlohmann::json();
    if (c.evaluation->reused_from) j["reused_from"] = *c.evaluation->reused_from;
  }
  if (with_code) {
    j["source"] = c.source;
    j["plan"] = c.plan_json;
    if (!c.raw_response.empty()) j["raw_response"] = c.raw_response;
    if (c.evaluation) j["evaluation"] = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  }
  return j;
}

int History(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  std::vector<store::SearchSummary> all;
  if (f.problem.empty()) {
    KS_ASSIGN_OR_RETURN_CLI(all, store->History(0));
  } else {
    KS_ASSIGN_OR_RETURN_CLI(auto problems, store->FindProblems(f.problem));
    if (problems.empty()) return ReportError(NotFound("no problem named " + f.problem + " in " + store->path()));
    for (const auto& p : problems) {
      KS_ASSIGN_OR_RETURN_CLI(auto h, store->History(p.id));
      all.insert(all.end(), h.begin(), h.end());
    }
  }
  if (f.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& s : all) {
      arr.push_back({{"search", s.search.id}, {"problem", s.problem_name},
                     {"status", store::SearchStatusName(s.search.status)}, {"stop_reason", s.search.stop_reason},
                     // As --rounds counts them: improvement rounds after round 0.
                     {"rounds", std::max(0, s.rounds - 1)},
                     {"rounds_asked", [&] {
                        auto c = nlohmann::json::parse(s.search.config_json, nullptr, false);
                        return c.is_object() ? c.value("rounds", 0) : 0;
                      }()},
                     {"candidates", s.candidates}, {"evaluated", s.evaluated},
                     {"correct", s.correct},
                     {"best_speedup", s.best_speedup_eager ? nlohmann::json(*s.best_speedup_eager) : nlohmann::json()},
                     {"precision", ContractOf(s.search.config_json)},
                     {"best_candidate", s.search.best_candidate ? nlohmann::json(*s.search.best_candidate)
                                                                : nlohmann::json()},
                     {"llm_calls", s.spend.calls}, {"failed_llm_calls", s.failed_calls},
                     {"first_llm_error", s.first_llm_error}, {"cost_usd", s.spend.cost_usd},
                     {"created", s.search.created}});
      if (auto counts = store->CountAttempts(s.search.id); counts.ok()) {
        arr.back()["tool_calls"] = counts->tool_calls;
        arr.back()["tool_errors"] = counts->tool_errors;
        arr.back()["practice_evaluations"] = counts->tests;
      }
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-6s %-22s %-10s %6s %6s %7s %8s %-11s %6s %6s %8s  %s\n", "search", "problem", "status", "rounds",
              "cands", "correct", "best", "contract", "calls", "failed", "cost", "created");
  for (const auto& s : all) {
    std::printf("%-6lld %-22s %-10s %6s %6lld %7lld %8s %-11s %6lld %6lld %8s  %s\n", static_cast<long long>(s.search.id),
                s.problem_name.c_str(), store::SearchStatusName(s.search.status), RoundsText(s).c_str(),
                static_cast<long long>(s.candidates), static_cast<long long>(s.correct),
                Opt(s.best_speedup_eager, "{:.2f}x").c_str(), ContractOf(s.search.config_json).c_str(),
                static_cast<long long>(s.spend.calls),
                static_cast<long long>(s.failed_calls), fmt::format("${:.2f}", s.spend.cost_usd).c_str(),
                s.search.created.c_str());
    // The reason a search found nothing is usually the model's error: say it here.
    if (s.failed_calls > 0) std::printf("       first failed model call: %s\n", s.first_llm_error.c_str());
    if (auto counts = store->CountAttempts(s.search.id); counts.ok() && counts->tool_calls > 0)
      std::printf("       agent: %lld tool calls (%lld answered as errors), %lld practice evaluations, %lld submitted\n",
                  static_cast<long long>(counts->tool_calls), static_cast<long long>(counts->tool_errors),
                  static_cast<long long>(counts->tests), static_cast<long long>(counts->submitted));
    if (s.search.status == store::SearchStatus::kFailed && !s.search.stop_reason.empty())
      std::printf("       failed: %s\n", s.search.stop_reason.c_str());
    else if (s.search.status == store::SearchStatus::kFinished && s.correct == 0)
      std::printf("       no correct kernel found\n");
  }
  return kExitOk;
}

int ShowCandidate(store::LineageStore* store, const CandidateRow& c, bool json) {
  std::string idea_text;
  if (c.idea_id) {
    auto idea = store->GetIdea(*c.idea_id);
    if (idea.ok()) idea_text = idea->text;
  }
  if (json) {
    auto j = CandidateJson(c, true);
    j["idea_text"] = idea_text;
    if (auto trail = LoadAgentTrail(store, c); trail.ok() && !trail->attempts.empty()) j["agent"] = AgentTrailJson(*trail);
    if (auto summary = store->Summarize(c.search_id); summary.ok()) {
      j["search_failed_llm_calls"] = summary->failed_calls;
      j["search_first_llm_error"] = summary->first_llm_error;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("candidate %lld  (search %lld, round %d, %s)\n", static_cast<long long>(c.id),
              static_cast<long long>(c.search_id), c.round, store::CandidateKindName(c.kind));
  std::printf("idea:    %s\n", idea_text.empty() ? "-" : idea_text.c_str());
  std::printf("parent:  %s\n", c.parent_candidate ? std::to_string(*c.parent_candidate).c_str() : "-");
  if (auto summary = store->Summarize(c.search_id); summary.ok() && summary->failed_calls > 0)
    std::printf("search:  %lld failed model calls; first: %s\n", static_cast<long long>(summary->failed_calls),
                summary->first_llm_error.c_str());
  if (c.evaluation) {
    std::printf("status:  %s%s\n", EvalStatusName(c.evaluation->status),
                c.evaluation->reused_from ? fmt::format(" (same kernel as {})", *c.evaluation->reused_from).c_str()
                                          : "");
    auto e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
    const std::string stored = e.is_object() ? e.value("precision", std::string()) : std::string();
    std::printf("time:    %s ms   speedup: %s eager, %s torch.compile   (precision contract %s)\n",
                Opt(c.evaluation->median_ms, "{:.4f}").c_str(), Opt(c.evaluation->speedup_eager, "{:.2f}x").c_str(),
                Opt(c.evaluation->speedup_compile, "{:.2f}x").c_str(),
                CanonicalContract(stored.empty() ? "highest" : stored).c_str());
    if (e.is_object() && !e.value("message", std::string()).empty())
      std::printf("message: %s\n", e.value("message", std::string()).c_str());
    if (e.is_object() && e.contains("robustness")) PrintRobustness(RobustnessFromJson(e["robustness"]));
    if (e.is_object()) {
      auto profiles = LaunchProfilesFromJson(e.value("launch_profiles", nlohmann::json::array()));
      if (!profiles.empty()) std::printf("each launch on its own:\n%s", LaunchProfileText(profiles, "  ").c_str());
      if (auto ev = EvaluationFromJson(e); ev.ok()) {
        if (ev->roofline && ev->roofline->floor_ms > 0)
          std::printf("floor:   %.0f%% of it reached; %s\n", 100 * ev->roofline->fraction_of_floor,
                      RooflineFloorText(*ev->roofline).c_str());
        if (ev->counters)
          std::printf("hardware counters (Nsight Compute):\n%s", CountersText(*ev->counters, "  ", 20000).c_str());
      }
    }
  } else {
    std::printf("status:  pending\n");
  }
  if (auto trail = LoadAgentTrail(store, c); trail.ok() && !trail->attempts.empty())
    std::printf("agent:   %zu tool calls before this candidate (compile and test on practice sets):\n%s",
                trail->attempts.size(), AgentTrailText(*trail, "  ").c_str());
  if (!c.raw_response.empty()) std::printf("\n--- model reply (unparsed) ---\n%s\n", c.raw_response.c_str());
  std::printf("\n--- source ---\n%s\n\n--- plan ---\n%s\n", c.source.c_str(), c.plan_json.c_str());
  return kExitOk;
}

int Show(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  KS_ASSIGN_OR_RETURN_CLI(auto c, store->GetCandidate(f.id));
  return ShowCandidate(store.get(), c, f.json);
}

int Best(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  KS_ASSIGN_OR_RETURN_CLI(auto problems, store->FindProblems(f.problem));
  if (problems.empty()) return ReportError(NotFound("no problem named " + f.problem + " in " + store->path()));
  std::optional<CandidateRow> best;
  for (const auto& p : problems) {
    KS_ASSIGN_OR_RETURN_CLI(auto b, store->BestCorrectForProblem(p.id));
    if (b && (!best || b->evaluation->median_ms.value_or(1e300) < best->evaluation->median_ms.value_or(1e300)))
      best = b;
  }
  if (!best) {
    std::fprintf(stderr, "kernelsearch: no correct kernel for %s yet\n", f.problem.c_str());
    return kExitFailed;
  }
  return ShowCandidate(store.get(), *best, f.json);
}

int Lineage(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  KS_ASSIGN_OR_RETURN_CLI(auto path, store->Lineage(f.id));
  if (f.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& c : path) {
      auto j = CandidateJson(c, false);
      if (c.idea_id) j["idea_text"] = store->GetIdea(*c.idea_id).ok() ? store->GetIdea(*c.idea_id)->text : "";
      if (auto trail = LoadAgentTrail(store.get(), c); trail.ok() && !trail->attempts.empty())
        j["agent"] = AgentTrailJson(*trail);
      arr.push_back(j);
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-4s %-9s %-5s %-7s %-14s %10s %8s  %s\n", "step", "candidate", "round", "kind", "status", "ms",
              "speedup", "idea");
  int step = 0;
  for (const auto& c : path) {
    std::string idea = c.idea_id && store->GetIdea(*c.idea_id).ok() ? store->GetIdea(*c.idea_id)->text : "-";
    if (idea.size() > 80) idea = idea.substr(0, 77) + "...";
    std::printf("%-4d %-9lld %-5d %-7s %-14s %10s %8s  %s\n", step++, static_cast<long long>(c.id), c.round,
                store::CandidateKindName(c.kind), c.evaluation ? EvalStatusName(c.evaluation->status) : "pending",
                c.evaluation ? Opt(c.evaluation->median_ms, "{:.4f}").c_str() : "-",
                c.evaluation ? Opt(c.evaluation->speedup_eager, "{:.2f}x").c_str() : "-", idea.c_str());
    // An agent's attempts, as a sub-tree of the candidate they led to.
    if (auto trail = LoadAgentTrail(store.get(), c); trail.ok() && !trail->attempts.empty())
      std::printf("%s", AgentTrailText(*trail, "       |- ").c_str());
  }
  return kExitOk;
}

int Export(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  ExportOptions options;
  options.arch = f.arch;
  options.allow_specialised = f.allow_specialised;
  KS_ASSIGN_OR_RETURN_CLI(auto files, ExportCandidate(store.get(), f.id, options));
  std::error_code ec;
  std::filesystem::create_directories(f.out_dir, ec);
  if (ec) return ReportError(FailedPrecondition("creating " + f.out_dir + ": " + ec.message()));
  std::string names;
  for (const auto& file : files) {
    Status st = WriteFile(f.out_dir + "/" + file.name, file.text);
    if (!st.ok()) return ReportError(st);
    names += (names.empty() ? "" : ", ") + file.name;
  }
  if (f.json)
    std::printf("%s\n", nlohmann::json({{"candidate", f.id}, {"out", f.out_dir}}).dump().c_str());
  else
    std::printf("wrote %s/{%s}\n", f.out_dir.c_str(), names.c_str());
  return kExitOk;
}

}  // namespace

void RegisterBrowseCommands(CLI::App& app) {
  auto add = [&](const char* name, const char* help, auto action, auto extra) {
    auto* f = new BrowseFlags();  // lives as long as the process: CLI11 binds to it
    auto* sub = app.add_subcommand(name, help);
    sub->add_option("--db", f->db, "lineage store (default $KS_DB or ~/.local/share/kernelsearch/lineage.db)");
    sub->add_flag("--json", f->json, "JSON for scripts");
    extra(sub, f);
    SetAction(sub, [f, action] { return action(*f); });
  };
  add("history", "searches in the store, newest first", History,
      [](CLI::App* s, BrowseFlags* f) { s->add_option("problem", f->problem, "only this problem (name or path)"); });
  add("best", "the fastest correct kernel of a problem", Best, [](CLI::App* s, BrowseFlags* f) {
    s->add_option("problem", f->problem, "problem name or path")->required();
  });
  add("show", "a candidate: code, plan, evaluation, idea, parent", Show,
      [](CLI::App* s, BrowseFlags* f) { s->add_option("id", f->id, "candidate id")->required(); });
  add("lineage", "the path from the first kernel to this one", Lineage,
      [](CLI::App* s, BrowseFlags* f) { s->add_option("id", f->id, "candidate id")->required(); });
  add("export", "write a candidate as .cu, plan and a PyTorch drop-in module", Export,
      [](CLI::App* s, BrowseFlags* f) {
        s->add_option("id", f->id, "candidate id")->required();
        s->add_option("--out", f->out_dir, "output directory")->required();
        s->add_option("--arch", f->arch,
                      "target to compile for at export when the evaluation recorded none (the module compiles for "
                      "the GPU it runs on; an arch-specific target such as sm_90a only for that architecture)")
            ->capture_default_str();
        s->add_flag("--allow-specialised", f->allow_specialised,
                    "export a kernel that a distribution-shifted input set broke (correct on get_inputs() only)");
      });
}

}  // namespace ks::cli
