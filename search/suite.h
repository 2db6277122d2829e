// Suites: many problems (a KernelBench level) searched or evaluated in one run,
// and the figures KernelBench users report for them.
//
// A searched suite is recorded in the lineage store (store::SuiteRow): one entry
// per problem file, each with its own search. SuiteRunner runs the entries in
// order; a killed or cancelled suite continues with Run() on the same id: an
// entry whose search finished is not run again, an unfinished search is resumed
// (the orchestrator's own resume), an entry that failed is tried again. One
// problem's failure (a bad file, a degenerate reference, an evaluator or model
// error) is recorded on its entry and the suite goes on.
//
// The report (SuiteReport) is one row per problem: status, the best correct
// kernel's speedup over eager and torch.compile, its fraction of the roofline
// floor; and the suite figures:
//   fast_p    share of ALL problems with a correct kernel more than p times
//             faster than the baseline (p = 0: any correct kernel), for
//             p = 0, 1, 2, against eager and against torch.compile (as
//             KernelBench defines fast_p: problems without a correct kernel
//             count in the denominator);
//   geomean   geometric mean of the best speedup over the problems that have a
//             correct kernel (with its count; a problem without one has no
//             speedup to average).
//
// Ownership and threading: SuiteRunner borrows its dependencies (as the
// Orchestrator does) and runs on the caller's thread; one Run() at a time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evaluator/evaluation.h"
#include "evaluator/judge/judge.h"
#include "evaluator/signature.h"
#include "search/evaluator_factory.h"
#include "llm/llm_client.h"
#include "search/prompt_template.h"
#include "search/orchestrator.h"
#include "search/search_config.h"
#include "search/search_setup.h"
#include "store/lineage_store.h"

namespace ks {

// One problem's line of a suite's table.
struct SuiteProblemResult {
  std::string problem;  // the file's stem: "19_ReLU"
  std::string file;
  // "correct"; an evaluation status ("incorrect", "compile_error", ...) for a
  // ready kernel that is not correct; "no correct kernel" (a search found
  // none); "no kernel" (batch evaluation: no file for this problem); "error"
  // (the problem could not be searched or evaluated: see message); "pending",
  // "running", "cancelled" (a search not run to its end).
  std::string status;
  std::string message;
  bool correct = false;
  std::optional<double> speedup_eager;
  std::optional<double> speedup_compile;
  // The precision contract its speedups are under (evaluator/judge/judge.h);
  // none when its evaluation does not say.
  std::optional<Contract> precision;
  std::optional<double> fraction_of_floor;  // floor_ms / median_ms of the best kernel
  std::optional<double> median_ms;
  std::optional<int64_t> search_id;
  std::optional<int64_t> candidate_id;
  std::string kernel_file;  // batch evaluation: the kernel that was evaluated
};

// fast_p thresholds, in the order of SuiteFigures' arrays.
inline constexpr std::array<double, 3> kFastP = {0.0, 1.0, 2.0};

struct SuiteFigures {
  int problems = 0;
  int correct = 0;
  std::array<double, 3> fast_eager{};    // fast_0, fast_1, fast_2 against eager
  std::array<double, 3> fast_compile{};  // the same against torch.compile
  std::optional<double> geomean_eager;   // over the problems with a correct kernel and a speedup
  std::optional<double> geomean_compile;
  int geomean_eager_n = 0;
  int geomean_compile_n = 0;
  // Against the faster of eager and torch.compile, as KernelBench-v3 reports them.
  std::array<double, 3> fast_best{};
  // The precision contract of every correct row that names one, printed next
  // to the figures: none when no row says, or when they differ (mixed_precision).
  std::optional<Contract> precision;
  bool mixed_precision = false;
};

struct SuiteReport {
  int64_t suite_id = 0;  // 0 for a batch evaluation (not stored)
  std::string status;    // the suite's status ("finished", "cancelled", ...); "" for a batch evaluation
  std::vector<SuiteProblemResult> rows;
  SuiteFigures figures;
};

SuiteFigures ComputeSuiteFigures(const std::vector<SuiteProblemResult>& rows);

// The table a person reads: one line per problem, then the figures.
std::string RenderSuiteHeader();
std::string RenderSuiteRow(int index, const SuiteProblemResult& row);
std::string RenderSuiteFigures(const SuiteFigures& f);
std::string RenderSuiteReport(const SuiteReport& report);

nlohmann::json SuiteProblemResultToJson(const SuiteProblemResult& row);
nlohmann::json SuiteFiguresToJson(const SuiteFigures& f);
// {"event": "suite", "suite": id, "status", "problems": [rows], "figures": {...}}
nlohmann::json SuiteReportToJson(const SuiteReport& report);

// The row of a ready kernel's evaluation (batch evaluation).
SuiteProblemResult ResultFromEvaluation(const std::string& problem_file, const Evaluation& e);
// The row of a suite entry, from its search in the store.
StatusOr<SuiteProblemResult> ResultFromEntry(store::LineageStore* store, const store::SuiteEntryRow& entry);
// Every entry's row and the figures.
StatusOr<SuiteReport> LoadSuiteReport(store::LineageStore* store, int64_t suite_id);

// The problem files named on a command line: a directory stands for its .py
// files, in natural order (KernelBench's "2_..." before "10_..."); a file for
// itself. NotFound for a path that does not exist; InvalidArgument when nothing
// is left. Files are not read here: a bad one is a failed row, not the end.
StatusOr<std::vector<std::string>> ListProblemFiles(const std::vector<std::string>& paths);
// "2_x.py" < "10_x.py": leading integers compare by value, then the names.
bool NaturalLess(const std::string& a, const std::string& b);

// Progress of a suite, for the live table.
struct SuiteEvent {
  enum class Type {
    kProblemStarted,   // index, problem
    kSearchProgress,   // index, problem, search (the orchestrator's event)
    kProblemFinished,  // index, problem, result
  };
  Type type = Type::kProblemStarted;
  int index = 0;  // 0-based position in the suite
  int count = 0;  // problems in the suite
  std::string problem;
  const SearchEvent* search = nullptr;  // kSearchProgress only; valid during the call
  SuiteProblemResult result;            // kProblemFinished only
  bool skipped = false;                 // kProblemFinished: finished in an earlier run, not run now
};
using SuiteEventCallback = std::function<void(const SuiteEvent&)>;

class SuiteRunner {
 public:
  // How a problem is prepared; the CLI uses the reference bridge and the
  // evaluator factory, tests use fakes (and inject failures).
  // Each problem's search is set up as every search is (search/search_setup.h);
  // tests replace its two seams (and inject failures). Empty = the real ones.
  struct Hooks {
    // The problem's signature, or why it cannot be searched (an unreadable or broken file).
    std::function<StatusOr<Signature>(const std::string& file)> signature;
    // The evaluator for one problem's search; the runner owns it for that problem only.
    std::function<StatusOr<SearchEvaluator>(const std::string& file)> evaluator;
  };
  struct Deps {
    store::LineageStore* store = nullptr;     // required
    LlmClient* llm = nullptr;                 // required
    const PromptLibrary* prompts = nullptr;   // required
    const std::atomic<bool>* cancel = nullptr;  // optional stop flag
    EvaluatorOptions evaluator;               // the real evaluator's options (spec, python, gpus)
    Hooks hooks;                              // optional seams
  };

  SuiteRunner(Deps deps, SuiteEventCallback on_event) : deps_(std::move(deps)), on_event_(std::move(on_event)) {}
  SuiteRunner(const SuiteRunner&) = delete;
  SuiteRunner& operator=(const SuiteRunner&) = delete;

  // Stores a new suite: `config` (validated) is what every problem's search gets.
  static StatusOr<int64_t> Create(store::LineageStore* store, const std::vector<std::string>& files,
                                  const SearchConfig& config);

  // Runs (or continues) the suite. Errors only for the store failing or a bad
  // id; a problem's failure is a row. A cancelled suite returns its report with
  // status "cancelled".
  StatusOr<SuiteReport> Run(int64_t suite_id);

 private:
  // Runs one entry; the error is the problem's, to be recorded on its row.
  Status RunEntry(int64_t suite_id, const store::SuiteEntryRow& entry, const SearchConfig& config, int count,
                  bool* cancelled);
  bool Cancelled() const { return deps_.cancel && deps_.cancel->load(); }

  Deps deps_;
  SuiteEventCallback on_event_;
};

// The search config stored with a suite.
StatusOr<SearchConfig> SuiteSearchConfig(const store::SuiteRow& suite);

}  // namespace ks
