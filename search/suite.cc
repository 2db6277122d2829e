#include "search/suite.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "evaluator/judge/judge.h"
#include "common/files.h"

namespace ks {
namespace {
namespace fs = std::filesystem;

std::string Stem(const std::string& path) { return fs::path(path).stem().string(); }

// The leading decimal number of a name, and where it ends.
std::optional<std::pair<uint64_t, size_t>> LeadingNumber(const std::string& s) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && i < 18) v = v * 10 + (s[i++] - '0');
  if (i == 0) return std::nullopt;
  return std::make_pair(v, i);
}

std::string Fmt(const std::optional<double>& v, const char* spec) {
  return v ? fmt::format(fmt::runtime(spec), *v) : "-";
}

// Shortens a message to one table cell.
std::string OneLine(const std::string& s, size_t max) {
  std::string out;
  for (char c : s) out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  if (out.size() > max) out = out.substr(0, max - 3) + "...";
  return out;
}

template <typename T>
void PutOpt(nlohmann::json& j, const char* key, const std::optional<T>& v) {
  j[key] = v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

bool NaturalLess(const std::string& a, const std::string& b) {
  auto na = LeadingNumber(a), nb = LeadingNumber(b);
  if (na && nb && na->first != nb->first) return na->first < nb->first;
  if (na.has_value() != nb.has_value()) return na.has_value();  // numbered problems first
  return a < b;
}

StatusOr<std::vector<std::string>> ListProblemFiles(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> here;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        if (e.path().extension() == ".py" && e.path().filename().string().rfind("__", 0) != 0)
          here.push_back(e.path().string());
      }
      if (ec) return PosixError(p, ec.value());
      std::sort(here.begin(), here.end(), [](const std::string& x, const std::string& y) {
        return NaturalLess(fs::path(x).filename().string(), fs::path(y).filename().string());
      });
      if (here.empty()) return InvalidArgument(p + ": no .py problem files in this directory");
      out.insert(out.end(), here.begin(), here.end());
    } else if (fs::exists(p, ec)) {
      out.push_back(p);
    } else {
      return NotFound(p + ": no such file or directory");
    }
  }
  if (out.empty()) return InvalidArgument("no problem files given");
  return out;
}

SuiteFigures ComputeSuiteFigures(const std::vector<SuiteProblemResult>& rows) {
  SuiteFigures f;
  f.problems = static_cast<int>(rows.size());
  std::array<int, 3> eager{}, compile{}, best{};
  double log_eager = 0, log_compile = 0;
  for (const auto& r : rows) {
    if (!r.correct) continue;
    f.correct++;
    if (r.precision && !f.mixed_precision) {
      if (f.precision && *f.precision != *r.precision) {
        f.mixed_precision = true;
        f.precision.reset();
      } else {
        f.precision = r.precision;
      }
    }
    std::optional<double> faster;
    if (r.speedup_eager && r.speedup_compile) faster = std::min(*r.speedup_eager, *r.speedup_compile);
    for (size_t p = 0; p < kFastP.size(); ++p) {
      // fast_0 is "correct"; above that, strictly faster than p times the baseline.
      if (kFastP[p] == 0 || (r.speedup_eager && *r.speedup_eager > kFastP[p])) eager[p]++;
      if (kFastP[p] == 0 || (r.speedup_compile && *r.speedup_compile > kFastP[p])) compile[p]++;
      if (kFastP[p] == 0 || (faster && *faster > kFastP[p])) best[p]++;
    }
    if (r.speedup_eager && *r.speedup_eager > 0) log_eager += std::log(*r.speedup_eager), f.geomean_eager_n++;
    if (r.speedup_compile && *r.speedup_compile > 0)
      log_compile += std::log(*r.speedup_compile), f.geomean_compile_n++;
  }
  if (f.problems > 0) {
    for (size_t p = 0; p < kFastP.size(); ++p) {
      f.fast_eager[p] = static_cast<double>(eager[p]) / f.problems;
      f.fast_compile[p] = static_cast<double>(compile[p]) / f.problems;
      f.fast_best[p] = static_cast<double>(best[p]) / f.problems;
    }
  }
  if (f.geomean_eager_n > 0) f.geomean_eager = std::exp(log_eager / f.geomean_eager_n);
  if (f.geomean_compile_n > 0) f.geomean_compile = std::exp(log_compile / f.geomean_compile_n);
  return f;
}

namespace {

// The figures' contract as printed: its name, "mixed", or `none`.
std::string FiguresContract(const SuiteFigures& f, const std::string& none) {
  if (f.mixed_precision) return "mixed";
  return f.precision ? ContractName(*f.precision) : none;
}

// An evaluation's recorded contract (evaluator/evaluation.h `precision`: a
// name or an older version's alias; "" where it predates contracts). An
// unknown name is no contract, and the row's note says so.
std::optional<Contract> RecordedContract(const std::string& name, std::string* message) {
  if (name.empty()) return std::nullopt;
  auto contract = ParseContract(name);
  if (contract.ok()) return *contract;
  if (message->empty()) *message = "unknown precision contract '" + name + "' recorded with its evaluation";
  return std::nullopt;
}

}  // namespace

std::string RenderSuiteHeader() {
  return fmt::format("{:>3}  {:<36} {:<18} {:>9} {:>9} {:>7}  {}\n", "#", "problem", "status", "vs eager",
                     "vs comp.", "floor", "note");
}

std::string RenderSuiteRow(int index, const SuiteProblemResult& r) {
  std::string note = r.message;
  if (note.empty() && r.candidate_id) note = fmt::format("search {}, candidate {}", r.search_id.value_or(0), *r.candidate_id);
  else if (note.empty() && !r.kernel_file.empty()) note = fs::path(r.kernel_file).filename().string();
  std::optional<double> floor_pct;
  if (r.fraction_of_floor) floor_pct = *r.fraction_of_floor * 100;
  return fmt::format("{:>3}  {:<36} {:<18} {:>9} {:>9} {:>7}  {}\n", index + 1, OneLine(r.problem, 36),
                     OneLine(r.status, 18), Fmt(r.speedup_eager, "{:.2f}x"), Fmt(r.speedup_compile, "{:.2f}x"),
                     Fmt(floor_pct, "{:.0f}%"), OneLine(note, 100));
}

std::string RenderSuiteFigures(const SuiteFigures& f) {
  auto pct = [](double v) { return fmt::format("{:.1f}%", v * 100); };
  std::string s = fmt::format("\n{} problems, {} with a correct kernel\n", f.problems, f.correct);
  s += fmt::format("{:<16} {:>8} {:>8} {:>8}   {}\n", "", "fast_0", "fast_1", "fast_2", "geomean speedup");
  s += fmt::format("{:<16} {:>8} {:>8} {:>8}   {}\n", "vs eager", pct(f.fast_eager[0]), pct(f.fast_eager[1]),
                   pct(f.fast_eager[2]),
                   f.geomean_eager ? fmt::format("{:.2f}x over {} problems", *f.geomean_eager, f.geomean_eager_n)
                                   : std::string("-"));
  s += fmt::format("{:<16} {:>8} {:>8} {:>8}   {}\n", "vs torch.compile", pct(f.fast_compile[0]),
                   pct(f.fast_compile[1]), pct(f.fast_compile[2]),
                   f.geomean_compile
                       ? fmt::format("{:.2f}x over {} problems", *f.geomean_compile, f.geomean_compile_n)
                       : std::string("-"));
  s += fmt::format("{:<16} {:>8} {:>8} {:>8}   {}\n", "vs the faster", pct(f.fast_best[0]), pct(f.fast_best[1]),
                   pct(f.fast_best[2]), "(of eager and torch.compile, as KernelBench-v3 reports)");
  s += "(fast_p: share of all problems with a correct kernel more than p times faster; fast_0: correct)\n";
  s += "precision contract: " + FiguresContract(f, "not recorded") +
       " (evaluator/judge/judge.h; a figure is comparable with published ones under kernelbench)\n";
  return s;
}

std::string RenderSuiteReport(const SuiteReport& report) {
  std::string s = RenderSuiteHeader();
  for (size_t i = 0; i < report.rows.size(); ++i) s += RenderSuiteRow(static_cast<int>(i), report.rows[i]);
  s += RenderSuiteFigures(report.figures);
  return s;
}

nlohmann::json SuiteProblemResultToJson(const SuiteProblemResult& r) {
  nlohmann::json j = {{"problem", r.problem}, {"file", r.file}, {"status", r.status}, {"correct", r.correct}};
  if (!r.message.empty()) j["message"] = r.message;
  PutOpt(j, "speedup_eager", r.speedup_eager);
  PutOpt(j, "speedup_compile", r.speedup_compile);
  if (r.precision) j["precision"] = ContractName(*r.precision);
  PutOpt(j, "fraction_of_floor", r.fraction_of_floor);
  PutOpt(j, "median_ms", r.median_ms);
  if (r.search_id) j["search"] = *r.search_id;
  if (r.candidate_id) j["candidate"] = *r.candidate_id;
  if (!r.kernel_file.empty()) j["kernel"] = r.kernel_file;
  return j;
}

nlohmann::json SuiteFiguresToJson(const SuiteFigures& f) {
  nlohmann::json j = {{"problems", f.problems}, {"correct", f.correct}};
  for (size_t p = 0; p < kFastP.size(); ++p) {
    int pi = static_cast<int>(kFastP[p]);
    j[fmt::format("fast_{}_eager", pi)] = f.fast_eager[p];
    j[fmt::format("fast_{}_compile", pi)] = f.fast_compile[p];
    j[fmt::format("fast_{}_best", pi)] = f.fast_best[p];
  }
  if (f.precision || f.mixed_precision) j["precision"] = FiguresContract(f, "");
  PutOpt(j, "geomean_speedup_eager", f.geomean_eager);
  PutOpt(j, "geomean_speedup_compile", f.geomean_compile);
  j["geomean_eager_problems"] = f.geomean_eager_n;
  j["geomean_compile_problems"] = f.geomean_compile_n;
  return j;
}

nlohmann::json SuiteReportToJson(const SuiteReport& report) {
  nlohmann::json j = {{"event", "suite"}};
  if (report.suite_id) j["suite"] = report.suite_id;
  if (!report.status.empty()) j["status"] = report.status;
  j["problems"] = nlohmann::json::array();
  for (const auto& r : report.rows) j["problems"].push_back(SuiteProblemResultToJson(r));
  j["figures"] = SuiteFiguresToJson(report.figures);
  return j;
}

SuiteProblemResult ResultFromEvaluation(const std::string& problem_file, const Evaluation& e) {
  SuiteProblemResult r;
  r.problem = Stem(problem_file);
  r.file = problem_file;
  r.status = EvalStatusName(e.status);
  r.correct = e.correct();
  if (!r.correct) {
    r.message = e.message;
    return r;
  }
  r.speedup_eager = e.speedup_eager;
  r.speedup_compile = e.speedup_compile;
  r.precision = RecordedContract(e.precision, &r.message);
  if (e.timing) r.median_ms = e.timing->median_ms;
  if (e.roofline && e.roofline->floor_ms > 0) r.fraction_of_floor = e.roofline->fraction_of_floor;
  return r;
}

StatusOr<SuiteProblemResult> ResultFromEntry(store::LineageStore* store, const store::SuiteEntryRow& entry) {
  SuiteProblemResult r;
  r.problem = Stem(entry.file_path);
  r.file = entry.file_path;
  r.message = entry.error;
  if (!entry.search_id) {
    r.status = entry.error.empty() ? "pending" : "error";
    return r;
  }
  r.search_id = entry.search_id;
  KS_ASSIGN_OR_RETURN(store::SearchRow search, store->GetSearch(*entry.search_id));
  KS_ASSIGN_OR_RETURN(std::optional<store::CandidateRow> best, store->BestCorrect(*entry.search_id));
  switch (search.status) {
    case store::SearchStatus::kFinished: r.status = best ? "correct" : "no correct kernel"; break;
    case store::SearchStatus::kPending: r.status = "pending"; break;
    case store::SearchStatus::kRunning: r.status = "running"; break;
    case store::SearchStatus::kCancelled: r.status = "cancelled"; break;
    case store::SearchStatus::kFailed: r.status = "error"; break;
  }
  if (r.message.empty() && search.status == store::SearchStatus::kFailed) r.message = search.stop_reason;
  if (best && best->evaluation) {
    // A kernel found before a search stopped early still counts: it was checked.
    r.correct = true;
    if (search.status != store::SearchStatus::kFinished) r.status = "correct (" + r.status + ")";
    r.candidate_id = best->id;
    r.speedup_eager = best->evaluation->speedup_eager;
    r.speedup_compile = best->evaluation->speedup_compile;
    r.median_ms = best->evaluation->median_ms;
    auto e = EvaluationFromJson(nlohmann::json::parse(best->evaluation->evaluation_json, nullptr, false));
    if (e.ok() && e->roofline && e->roofline->floor_ms > 0) r.fraction_of_floor = e->roofline->fraction_of_floor;
    if (e.ok()) r.precision = RecordedContract(e->precision, &r.message);
  }
  return r;
}

StatusOr<SuiteReport> LoadSuiteReport(store::LineageStore* store, int64_t suite_id) {
  KS_ASSIGN_OR_RETURN(store::SuiteRow suite, store->GetSuite(suite_id));
  SuiteReport report;
  report.suite_id = suite.id;
  report.status = store::SearchStatusName(suite.status);
  for (const auto& entry : suite.entries) {
    KS_ASSIGN_OR_RETURN(SuiteProblemResult r, ResultFromEntry(store, entry));
    report.rows.push_back(std::move(r));
  }
  report.figures = ComputeSuiteFigures(report.rows);
  return report;
}

StatusOr<SearchConfig> SuiteSearchConfig(const store::SuiteRow& suite) {
  nlohmann::json j = nlohmann::json::parse(suite.config_json, nullptr, false);
  if (!j.is_object() || !j.contains("search"))
    return Internal("suite " + std::to_string(suite.id) + ": stored config has no \"search\" object");
  return SearchConfigFromJson(j["search"]);
}

StatusOr<int64_t> SuiteRunner::Create(store::LineageStore* store, const std::vector<std::string>& files,
                                      const SearchConfig& config) {
  KS_RETURN_IF_ERROR(config.Validate());
  if (files.empty()) return InvalidArgument("a suite needs at least one problem");
  // Absolute paths: a resumed suite may run from another directory.
  std::vector<std::string> absolute;
  for (const auto& f : files) {
    std::error_code ec;
    fs::path a = fs::absolute(f, ec);
    absolute.push_back(ec ? f : a.lexically_normal().string());
  }
  nlohmann::json j = {{"search", SearchConfigToJson(config)}};
  return store->CreateSuite(j.dump(), absolute);
}

Status SuiteRunner::RunEntry(int64_t suite_id, const store::SuiteEntryRow& entry, const SearchConfig& base,
                             int count, bool* cancelled) {
  store::LineageStore* store = deps_.store;
  const std::string& file = entry.file_path;
  // Set up as every search is (search/search_setup.h): the model client is
  // the suite's own, shared by its problems.
  SetupOptions so;
  so.evaluator = deps_.evaluator;
  so.need_model = false;
  so.load_signature = deps_.hooks.signature;
  so.make_evaluator = deps_.hooks.evaluator;
  std::unique_ptr<SearchSetup> setup;
  if (!entry.search_id) {
    NewSearchRequest request{.problem_file = file, .config = base, .python = deps_.evaluator.python};
    KS_ASSIGN_OR_RETURN(setup, SearchSetup::Create(store, request, so));
  } else {
    // The stored problem text is what the search runs on (the file may have
    // moved or changed since).
    KS_ASSIGN_OR_RETURN(setup, SearchSetup::Open(store, *entry.search_id, so, "", file));
  }
  std::optional<int64_t> search_id = setup->search_id();
  KS_RETURN_IF_ERROR(store->SetSuiteEntry(suite_id, entry.position, search_id, ""));
  // The GPU side: the reference is computed and checked before anything is spent on the model.
  KS_RETURN_IF_ERROR(setup->PrepareEvaluator());
  CandidateEvaluator* evaluator = setup->evaluator();
  std::string name = Stem(file);
  int index = entry.position;
  Orchestrator orch({.store = store, .llm = deps_.llm, .evaluator = evaluator, .prompts = deps_.prompts,
                     .cancel = deps_.cancel, .practice_evaluator = setup->practice_evaluator()},
                    [&](const SearchEvent& e) {
                      if (!on_event_) return;
                      SuiteEvent se{.type = SuiteEvent::Type::kSearchProgress, .index = index, .count = count,
                                    .problem = name, .search = &e};
                      on_event_(se);
                    });
  auto out = orch.Run(*search_id);
  if (!out.ok()) return out.status();
  if (out->status == store::SearchStatus::kCancelled) *cancelled = true;
  return Status::Ok();
}

StatusOr<SuiteReport> SuiteRunner::Run(int64_t suite_id) {
  store::LineageStore* store = deps_.store;
  if (!store || !deps_.llm || !deps_.prompts)
    return Internal("SuiteRunner: missing dependencies");
  KS_ASSIGN_OR_RETURN(store::SuiteRow suite, store->GetSuite(suite_id));
  KS_ASSIGN_OR_RETURN(SearchConfig config, SuiteSearchConfig(suite));
  KS_RETURN_IF_ERROR(store->SetSuiteStatus(suite_id, store::SearchStatus::kRunning));
  const int count = static_cast<int>(suite.entries.size());
  bool cancelled = false;
  for (const auto& entry : suite.entries) {
    if (Cancelled()) {
      cancelled = true;
      break;
    }
    std::string name = Stem(entry.file_path);
    bool done = false;
    if (entry.search_id) {
      KS_ASSIGN_OR_RETURN(store::SearchRow search, store->GetSearch(*entry.search_id));
      done = search.status == store::SearchStatus::kFinished;
    }
    if (!done) {
      if (on_event_) on_event_({.type = SuiteEvent::Type::kProblemStarted, .index = entry.position, .count = count,
                                .problem = name});
      Status st = RunEntry(suite_id, entry, config, count, &cancelled);
      if (!st.ok()) {
        // The store itself failing ends the suite; anything else is this problem's row.
        KS_ASSIGN_OR_RETURN(store::SuiteRow again, store->GetSuite(suite_id));
        // The row names the problem: its folder would only push the reason out of the table.
        std::string message = st.message();
        const std::string dir = fs::path(entry.file_path).parent_path().string() + "/";
        for (size_t at; dir.size() > 1 && (at = message.find(dir)) != std::string::npos;) message.erase(at, dir.size());
        KS_RETURN_IF_ERROR(store->SetSuiteEntry(suite_id, entry.position, again.entries[entry.position].search_id,
                                                message));
      }
    }
    KS_ASSIGN_OR_RETURN(store::SuiteRow now, store->GetSuite(suite_id));
    KS_ASSIGN_OR_RETURN(SuiteProblemResult result, ResultFromEntry(store, now.entries[entry.position]));
    if (on_event_) on_event_({.type = SuiteEvent::Type::kProblemFinished, .index = entry.position, .count = count,
                              .problem = name, .result = result, .skipped = done});
    if (cancelled) break;
  }
  KS_RETURN_IF_ERROR(
      store->SetSuiteStatus(suite_id, cancelled ? store::SearchStatus::kCancelled : store::SearchStatus::kFinished));
  return LoadSuiteReport(store, suite_id);
}

}  // namespace ks
