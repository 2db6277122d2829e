#include "search/report.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include <fmt/format.h>

#include "evaluator/judge/judge.h"
#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"
#include "evaluator/profile/roofline.h"
#include "search/agent.h"

// The page template and ECharts are compiled in (assembler .incbin of the files
// named by CMake), so that `kernelsearch report` and the server need no data
// files at run time and a page can never pick up a different library version.
asm(".section .rodata\n"
    ".global ks_report_echarts_begin\n"
    "ks_report_echarts_begin:\n"
    ".incbin \"" KS_REPORT_ECHARTS_JS "\"\n"
    ".global ks_report_echarts_end\n"
    "ks_report_echarts_end:\n"
    ".global ks_report_html_begin\n"
    "ks_report_html_begin:\n"
    ".incbin \"" KS_REPORT_HTML "\"\n"
    ".global ks_report_html_end\n"
    "ks_report_html_end:\n"
    ".previous\n");
extern "C" const char ks_report_echarts_begin[], ks_report_echarts_end[];
extern "C" const char ks_report_html_begin[], ks_report_html_end[];

namespace ks {
namespace {

using store::CandidateRow;

nlohmann::json Opt(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); }

// JSON inside <script>: '<' only occurs in strings, where \u003c means the
// same, so no source text can close the script element.
std::string ScriptSafe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

bool ReplaceOnce(std::string* s, const std::string& marker, const std::string& with) {
  size_t at = s->find(marker);
  if (at == std::string::npos) return false;
  s->replace(at, marker.size(), with);
  return true;
}

std::string IdeaOutcome(int64_t idea_id, const std::vector<CandidateRow>& cands) {
  std::optional<double> best;
  std::map<std::string, int> failures;
  int n = 0, pending = 0;
  for (const auto& c : cands) {
    if (c.idea_id != idea_id || c.kind == store::CandidateKind::kRepair) continue;
    ++n;
    if (!c.evaluation) {
      ++pending;
      continue;
    }
    if (c.evaluation->status == EvalStatus::kCorrect) {
      double s = c.evaluation->speedup_eager.value_or(0);
      if (!best || s > *best) best = s;
    } else {
      failures[EvalStatusName(c.evaluation->status)]++;
    }
  }
  if (n == 0) return "no implementation";
  std::string out = best ? fmt::format("correct, best {:.2f}x over eager", *best) : "no correct implementation";
  for (const auto& [status, k] : failures) out += fmt::format("; {} {}", k, status);
  if (pending) out += fmt::format("; {} pending", pending);
  return out;
}

// What the page shows of one candidate's stored evaluation JSON.
struct EvaluationView {
  nlohmann::json json;  // the whole evaluation, or null while pending
  std::optional<double> roofline_fraction;
  std::string message, robustness, floor_text, counters_text;
  bool specialised = false;
};

// The PyTorch timings, taken from the first evaluation that carries them.
struct Baselines {
  std::optional<double> eager_ms, compile_ms;
};

EvaluationView ViewEvaluation(const CandidateRow& c, Baselines* baselines) {
  EvaluationView v;
  if (!c.evaluation) return v;
  nlohmann::json& e = v.json;
  e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  if (!e.is_object()) return v;
  if (e.contains("roofline") && e["roofline"].is_object())
    v.roofline_fraction = e["roofline"].value("fraction_of_floor", 0.0);
  // The floor's basis and the counters' digest, as `eval` words them.
  if (auto ev = EvaluationFromJson(e); ev.ok()) {
    if (ev->roofline) v.floor_text = RooflineFloorText(*ev->roofline);
    if (ev->counters) v.counters_text = CountersText(*ev->counters, "", 4000);
  }
  if (!baselines->eager_ms && e.contains("eager") && e["eager"].is_object())
    baselines->eager_ms = e["eager"].value("median_ms", 0.0);
  if (!baselines->compile_ms && e.contains("compiled") && e["compiled"].is_object())
    baselines->compile_ms = e["compiled"].value("median_ms", 0.0);
  v.message = e.value("message", std::string());
  if (e.contains("robustness") && e["robustness"].is_object()) {
    // What held beyond get_inputs(): a specialised kernel is marked in the table and its detail.
    Robustness r = RobustnessFromJson(e["robustness"]);
    v.specialised = r.specialised();
    v.robustness = r.Summary();
  }
  return v;
}

// Bank kernels shown by the prompt that produced a candidate (round-0
// implement slots are the candidates' own; ideas slots are their idea's prefix).
std::vector<int64_t> BankShownFor(const std::map<std::string, std::vector<int64_t>>& bank_by_slot,
                                  const std::string& slot_key) {
  std::vector<int64_t> bank;
  for (const auto& [slot, ids] : bank_by_slot)
    if (slot == slot_key || (!slot.empty() && slot_key.rfind(slot + "/", 0) == 0))
      bank.insert(bank.end(), ids.begin(), ids.end());
  return bank;
}

nlohmann::json CandidateJson(const CandidateRow& c, const std::string& idea, const EvaluationView& v,
                             std::vector<int64_t> bank) {
  return {{"id", c.id},
          {"round", c.round},
          {"parent", c.parent_candidate ? nlohmann::json(*c.parent_candidate) : nlohmann::json()},
          {"idea", idea},
          {"kind", store::CandidateKindName(c.kind)},
          {"status", c.evaluation ? EvalStatusName(c.evaluation->status) : "pending"},
          {"median_ms", c.evaluation ? Opt(c.evaluation->median_ms) : nlohmann::json()},
          {"speedup_eager", c.evaluation ? Opt(c.evaluation->speedup_eager) : nlohmann::json()},
          {"speedup_compile", c.evaluation ? Opt(c.evaluation->speedup_compile) : nlohmann::json()},
          {"roofline_fraction", Opt(v.roofline_fraction)},
          {"message", v.message},
          {"floor", v.floor_text},
          {"counters", v.counters_text},
          {"specialised", v.specialised},
          {"robustness", v.robustness},
          {"source", c.source.empty() ? c.raw_response : c.source},
          {"plan", c.plan_json},
          {"evaluation", v.json},
          {"bank_shown", std::move(bank)}};
}

// Every candidate as the page's table and tree draw it, an agent's attempts
// under the candidate they led to; the baselines from the first that has them.
StatusOr<nlohmann::json> CandidatesJson(store::LineageStore* store, const std::vector<CandidateRow>& cands,
                                        const std::vector<store::IdeaRow>& ideas,
                                        const std::vector<std::pair<std::string, int64_t>>& shown,
                                        Baselines* baselines) {
  std::map<int64_t, std::string> idea_text;
  for (const auto& i : ideas) idea_text[i.id] = i.text;
  std::map<std::string, std::vector<int64_t>> bank_by_slot;
  for (const auto& [slot, id] : shown) bank_by_slot[slot].push_back(id);

  nlohmann::json jc = nlohmann::json::array();
  for (const auto& c : cands) {
    EvaluationView v = ViewEvaluation(c, baselines);
    jc.push_back(CandidateJson(c, c.idea_id ? idea_text[*c.idea_id] : std::string(), v,
                               BankShownFor(bank_by_slot, c.slot_key)));
    KS_ASSIGN_OR_RETURN(AgentTrail trail, LoadAgentTrail(store, c));
    if (!trail.attempts.empty()) jc.back()["agent"] = AgentTrailJson(trail);
  }
  return jc;
}

// The last round: of any candidate, or of the store's round records (a round may have none).
StatusOr<int> LastRoundOf(store::LineageStore* store, int64_t search_id, const std::vector<CandidateRow>& cands) {
  int max_round = -1;
  for (const auto& c : cands) max_round = std::max(max_round, c.round);
  KS_ASSIGN_OR_RETURN(auto last_round, store->LastRound(search_id));
  if (last_round) max_round = std::max(max_round, last_round->round);
  return max_round;
}

// The best speedups found up to and including each round.
nlohmann::json BestByRound(const std::vector<CandidateRow>& cands, int max_round) {
  nlohmann::json rounds = nlohmann::json::array();
  std::optional<double> best_e, best_c;
  for (int r = 0; r <= max_round; ++r) {
    for (const auto& c : cands) {
      if (c.round != r || !c.evaluation || c.evaluation->status != EvalStatus::kCorrect) continue;
      if (c.evaluation->speedup_eager && (!best_e || *c.evaluation->speedup_eager > *best_e))
        best_e = c.evaluation->speedup_eager;
      if (c.evaluation->speedup_compile && (!best_c || *c.evaluation->speedup_compile > *best_c))
        best_c = c.evaluation->speedup_compile;
    }
    rounds.push_back({{"round", r}, {"best_speedup_eager", Opt(best_e)}, {"best_speedup_compile", Opt(best_c)}});
  }
  return rounds;
}

// The best candidate's ancestry, root first (drawn thick in the tree).
StatusOr<nlohmann::json> BestPathJson(store::LineageStore* store, const store::SearchSummary& summary) {
  nlohmann::json best_path = nlohmann::json::array();
  if (summary.search.best_candidate) {
    KS_ASSIGN_OR_RETURN(auto path, store->Lineage(*summary.search.best_candidate));
    for (const auto& c : path) best_path.push_back(c.id);
  }
  return best_path;
}

nlohmann::json IdeasJson(const std::vector<store::IdeaRow>& ideas, const std::vector<CandidateRow>& cands) {
  nlohmann::json ji = nlohmann::json::array();
  for (const auto& i : ideas)
    ji.push_back({{"id", i.id},
                  {"round", i.round},
                  {"parent", i.parent_candidate ? nlohmann::json(*i.parent_candidate) : nlohmann::json()},
                  {"text", i.text},
                  {"outcome", IdeaOutcome(i.id, cands)}});
  return ji;
}

// The search's header: its problem, status, GPU, contract and model calls.
nlohmann::json SearchJson(int64_t search_id, const store::SearchSummary& summary, const nlohmann::json& config) {
  std::string gpu;
  if (config.is_object() && config.contains("gpu") && config["gpu"].is_object())
    gpu = config["gpu"].value("name", std::string());
  return {{"id", search_id},
          {"problem", summary.problem_name},
          {"status", store::SearchStatusName(summary.search.status)},
          {"stop_reason", summary.search.stop_reason},
          {"created", summary.search.created},
          {"gpu", gpu},
          {"correct", summary.correct},
          {"best_candidate", summary.search.best_candidate ? nlohmann::json(*summary.search.best_candidate)
                                                           : nlohmann::json()},
          {"best_speedup_eager", Opt(summary.best_speedup_eager)},
          {"precision", CanonicalContract(config.is_object() && config.contains("precision") &&
                                                  config["precision"].is_string()
                                              ? config["precision"].get<std::string>()
                                              : std::string("highest"))},
          {"llm_calls", summary.spend.calls},
          {"failed_llm_calls", summary.failed_calls},
          {"first_llm_error", summary.first_llm_error},
          {"config", config}};
}

}  // namespace

std::string_view EchartsSource() {
  return std::string_view(ks_report_echarts_begin, ks_report_echarts_end - ks_report_echarts_begin);
}

StatusOr<int64_t> ResolveReportTarget(store::LineageStore* store, const std::string& target) {
  if (!target.empty() && std::all_of(target.begin(), target.end(), [](unsigned char c) { return std::isdigit(c); })) {
    int64_t id = std::stoll(target);
    KS_RETURN_IF_ERROR(store->GetSearch(id).status());
    return id;
  }
  KS_ASSIGN_OR_RETURN(auto problems, store->FindProblems(target));
  int64_t newest = 0;
  for (const auto& p : problems) {
    KS_ASSIGN_OR_RETURN(auto searches, store->History(p.id));
    for (const auto& s : searches) newest = std::max(newest, s.search.id);
  }
  if (newest == 0) return NotFound("no search with id or problem '" + target + "' in " + store->path());
  return newest;
}

StatusOr<nlohmann::json> ReportData(store::LineageStore* store, int64_t search_id) {
  KS_ASSIGN_OR_RETURN(store::SearchSummary summary, store->Summarize(search_id));
  KS_ASSIGN_OR_RETURN(auto cands, store->ListCandidates(search_id));
  KS_ASSIGN_OR_RETURN(auto ideas, store->ListIdeas(search_id));
  KS_ASSIGN_OR_RETURN(auto shown, store->ListBankShown(search_id));
  nlohmann::json config = nlohmann::json::parse(summary.search.config_json, nullptr, false);

  Baselines baselines;
  KS_ASSIGN_OR_RETURN(nlohmann::json jc, CandidatesJson(store, cands, ideas, shown, &baselines));
  KS_ASSIGN_OR_RETURN(int max_round, LastRoundOf(store, search_id, cands));
  KS_ASSIGN_OR_RETURN(nlohmann::json best_path, BestPathJson(store, summary));

  nlohmann::json j;
  j["search"] = SearchJson(search_id, summary, config);
  j["eager_ms"] = Opt(baselines.eager_ms);
  j["compile_ms"] = Opt(baselines.compile_ms);
  j["candidates"] = std::move(jc);
  j["ideas"] = IdeasJson(ideas, cands);
  j["rounds"] = BestByRound(cands, max_round);
  j["best_path"] = std::move(best_path);
  return j;
}

StatusOr<std::string> RenderReportHtml(store::LineageStore* store, int64_t search_id) {
  KS_ASSIGN_OR_RETURN(nlohmann::json data, ReportData(store, search_id));
  std::string page(ks_report_html_begin, ks_report_html_end - ks_report_html_begin);
  // Replacement text is inserted verbatim; the library is minified JavaScript
  // that holds no "</script" (checked here, since it would end the element).
  std::string_view lib = EchartsSource();
  KS_CHECK(lib.find("</script") == std::string_view::npos);
  KS_CHECK(ReplaceOnce(&page, "/*KS_DATA*/", ScriptSafe(data.dump(-1, ' ', false,
                                                                  nlohmann::json::error_handler_t::replace))));
  KS_CHECK(ReplaceOnce(&page, "/*KS_ECHARTS*/", std::string(lib)));
  return page;
}

}  // namespace ks
