// One way to set a search up, for every caller: `kernelsearch search`
// (continuous, the model side of a split search, resumed), `evaluate-pending`,
// `suite` and the server's jobs. It holds what a search runs with: the problem
// (as a file the bridge can read), the config (parsed and validated once, then
// read back from the store), the routed model client, the evaluator and the
// GPU facts. Because every caller goes through it, the server refuses what the
// CLI refuses, by construction.
//
// Two sides, as in a split search:
//  - the model side (Create, Open) never runs the problem on data: the
//    signature comes from the meta device (shape inference; a 30 GB problem
//    answers in about a second), and the GPU facts for the prompts come from
//    what a GPU node of that name measured, else from the datasheet
//    (search/gpu_datasheet.h);
//  - the GPU side (PrepareEvaluator) computes the reference where the GPU is,
//    and stops the search, recorded `failed` with the reason, when the
//    reference cannot judge kernels: degenerate outputs (unless the config
//    allows them) or a forward that is not deterministic. The check runs
//    before any candidate is judged.
//
// Owns its evaluator and model client; lives as long as the run that uses
// them. Not thread-safe (one caller sets a search up, then hands the parts to
// an Orchestrator, which is).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/evaluator_api.h"
#include "evaluator/signature.h"
#include "llm/llm_client.h"
#include "llm/llm_factory.h"
#include "search/evaluator_factory.h"
#include "search/prompts.h"
#include "search/search_config.h"
#include "store/lineage_store.h"

namespace ks {

// The stop reason of a search whose reference cannot judge kernels starts with
// this; such a search is not resumed (the problem must change first).
inline constexpr const char* kReferenceRefusal = "the reference cannot judge kernels: ";
// The stop reason of a search that ran all its rounds (the orchestrator's);
// such a search, and only such a one, goes on when given more rounds.
inline constexpr const char* kStopRounds = "rounds";

struct SetupOptions {
  EvaluatorOptions evaluator;  // the GPU side: spec ("" = gpu, fake[:FILE]), python, gpus
  // The model side: keys, timeouts, prices, transcript, cancel. The spec and the
  // per-role specs come from the search's config.
  LlmConfig llm;
  bool need_model = true;      // false: no model client (evaluate-pending, a GPU node)
  // Told when a slow phase starts, so that no phase is silent for minutes. May be empty.
  std::function<void(const std::string& what)> on_phase;
  // Seams for tests (suites inject fakes and failures); empty = the real ones:
  // the bridge's signature on the meta device, MakeSearchEvaluator(file, evaluator).
  std::function<StatusOr<Signature>(const std::string& file)> load_signature;
  std::function<StatusOr<SearchEvaluator>(const std::string& file)> make_evaluator;
};

struct NewSearchRequest {
  std::string problem_file;
  std::string problem_source;          // "" = read problem_file
  SearchConfig config;                 // validated by Create
  std::optional<Signature> signature;  // known already (--signature, a submitted problem): no bridge run
  std::string gpu_name;                // --gpu: what the prompts name (facts: measured in the store, else datasheet)
  std::string python;                  // the bridge's interpreter, "" = the default order
};

class SearchSetup {
 public:
  // A new search in `store`: the model client first (a bad spec or a missing
  // key fails before anything is written), then the problem's signature from
  // the meta device, then the search row. The GPU facts for the prompts:
  // `request.gpu_name`'s measured facts from the store, else its datasheet
  // figures, else unknown (a note says so); a continuous search replaces them
  // with what its evaluator measures (PrepareEvaluator).
  static StatusOr<std::unique_ptr<SearchSetup>> Create(store::LineageStore* store, const NewSearchRequest& request,
                                                       SetupOptions options);

  // An existing search, as stored: its problem text and config. `model`, when
  // not empty, replaces the config's default model for the rest of the search
  // (a key changed, a model failed: the tree's shape stays). A search that
  // failed because its reference cannot judge kernels is FailedPrecondition.
  // `problem_path`, when it still holds the stored text, is the file used
  // (else the stored path, else a copy: StoredProblemFile).
  static StatusOr<std::unique_ptr<SearchSetup>> Open(store::LineageStore* store, int64_t search_id,
                                                     SetupOptions options, const std::string& model = "",
                                                     const std::string& problem_path = "");

  SearchSetup(const SearchSetup&) = delete;
  SearchSetup& operator=(const SearchSetup&) = delete;

  // The GPU side: makes the evaluator (the reference is computed or reused),
  // checks that the reference can judge kernels, and stores the GPU facts the
  // evaluator measured under this search. A problem the reference refuses
  // (degenerate, nondeterministic) is InvalidArgument and the search is
  // recorded `failed` with the same message; an environment without a GPU is
  // FailedPrecondition and leaves the search as it was.
  Status PrepareEvaluator();

  int64_t search_id() const { return search_id_; }
  const SearchConfig& config() const { return config_; }
  const std::string& problem_file() const { return problem_file_; }
  CandidateEvaluator* evaluator() const { return evaluator_.get(); }
  // The agent's practice evaluator (SearchConfig::implement "agent"): made by
  // PrepareEvaluator beside the judging one, on practice input sets
  // (kPracticeReferenceSeed, one GPU); null in one-shot mode.
  CandidateEvaluator* practice_evaluator() const { return practice_evaluator_.get(); }
  LlmClient* llm() const { return llm_.get(); }
  // What the evaluator measured (PrepareEvaluator), if it stands for a device.
  const std::optional<GpuFacts>& measured_gpu() const { return measured_gpu_; }
  // What the user should know that is not an error (no facts for --gpu NAME).
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  Status MakePracticeEvaluator(EvaluatorOptions eo);
  SearchSetup(store::LineageStore* store, SetupOptions options) : store_(store), options_(std::move(options)) {}
  Status MakeModel();
  void Phase(const std::string& what) const {
    if (options_.on_phase) options_.on_phase(what);
  }

  store::LineageStore* store_;
  SetupOptions options_;
  int64_t search_id_ = 0;
  SearchConfig config_;
  std::string problem_file_;
  std::unique_ptr<LlmClient> llm_;
  std::unique_ptr<CandidateEvaluator> evaluator_;
  std::unique_ptr<CandidateEvaluator> practice_evaluator_;
  std::optional<GpuFacts> measured_gpu_;
  std::vector<std::string> notes_;
};

// A stored search given a new total of rounds before it is resumed
// (`search --resume ID --rounds N`, the server's ContinueSearch). The total
// counts as --rounds does when a search is created: improvement rounds after
// round 0, so a finished search of 3 rounds given 5 runs rounds 4 and 5.
struct RoundsChange {
  int before = 0;          // the total it had
  int after = 0;           // the total it has now
  bool reopened = false;   // it had finished and is pending again
  // One line for the user: "search 7 ran its 3 rounds; running rounds 4 to 5 (5 in all)".
  std::string Describe(int64_t search_id) const;
};

// The one rule for giving a stored search a new total of rounds, for the CLI
// and the server alike. A search that finished on its rounds must be given
// more than it ran (InvalidArgument otherwise); its config's total is raised
// and it is pending again, so that its next run goes on from its beam like
// any next round: the rounds it ran are complete and no model call is made
// twice. One that finished on a budget or its target is FailedPrecondition
// (more rounds would stop at once, for the same reason); one that failed
// because its reference cannot judge kernels too. An unfinished one (pending,
// running, cancelled, failed) keeps its state with the new total.
StatusOr<RoundsChange> SetSearchRounds(store::LineageStore* store, int64_t search_id, int rounds);
// The change SetSearchRounds would make to `search`, or why it refuses;
// changes nothing (a caller checks before it commits to anything else).
StatusOr<RoundsChange> PlanSearchRounds(const store::SearchRow& search, int rounds);

// What to tell a user who resumes a finished search without giving rounds:
// that it is finished, why, and how to add rounds ("" for a search that is
// not finished). `command` is how the user resumes with a total, with {id}
// and {rounds} in it ("kernelsearch search --resume {id} --rounds {rounds}").
std::string FinishedSearchNote(const store::SearchRow& search, const SearchConfig& config,
                               const std::string& command);

// The facts the prompts of a new search state about the GPU `name` names: the
// latest measured ones in `store`, else the datasheet's (marked so), else
// nullopt (the prompts then say the figures are unknown).
StatusOr<std::optional<GpuFacts>> GpuFactsForName(store::LineageStore* store, const std::string& name);

// The routed model client a search's config names (its default model and
// per-role models) over `base` (keys, timeouts, prices, transcript, cancel).
StatusOr<std::unique_ptr<LlmClient>> MakeSearchModel(const SearchConfig& config, LlmConfig base);

// The refusal of a reference that cannot judge kernels (degenerate outputs),
// with the message the CLI has always given; Ok when `degenerate` is empty or
// the config allows it.
Status CheckReferenceCanJudge(const std::string& problem, const std::vector<std::string>& degenerate,
                              const SearchConfig& config);

// A file holding the problem text a search was created with: `path` or the
// stored path when either still holds that text, else a copy of the stored
// text in a temporary folder (a GPU node may not have the model side's paths,
// and a file may have changed since).
StatusOr<std::string> StoredProblemFile(const store::ProblemRow& problem, const std::string& path = "");

}  // namespace ks
