// The lineage store: everything a search did, in one SQLite file (WAL mode).
// Problems, searches (config, status), per-round beams, ideas, candidates,
// evaluations and every LLM call. A killed search resumes from it; the CLI's
// history/best/show/lineage/export and the gRPC server read it.
//
// Ownership and lifetime: a LineageStore owns one sqlite3 connection to its file
// and closes it when destroyed. Several processes may open the same file (WAL and
// a busy timeout make their writes take turns).
//
// Thread-safety: every method may be called from any thread; one mutex serializes
// use of the connection. Every write method is one transaction, committed before
// it returns, so `kill -9` at any moment loses at most the work in flight.
//
// Idempotence (what resume relies on): ideas and candidates carry a slot key that
// names the step that produced them ("r2/p17/i0", "r2/i45/b1", "repair/c88");
// inserting a second row with the same (search, slot key) returns the first
// row's id instead. LLM calls carry the same slot key and a SHA-256 of their
// prompt, so a resumed search finds a finished call instead of repeating it.
#pragma once

#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <utility>

#include "common/status.h"
#include "evaluator/evaluation.h"
#include "llm/llm_client.h"
#include "store/sqlite_handle.h"

namespace ks::store {

// The schema version this build writes. Older files are migrated on open.
int LatestSchemaVersion();

// Where the store lives unless --db says otherwise: $KS_DB, else
// $XDG_DATA_HOME/kernelsearch/lineage.db, else ~/.local/share/kernelsearch/lineage.db.
std::string DefaultDbPath();

struct ProblemRow {
  int64_t id = 0;
  std::string name;
  std::string file_path;
  std::string source;          // the problem .py text as it was when first stored
  std::string signature_json;  // SignatureToJson, or "{}" when not yet known
  std::string sha256;          // of source: one row per distinct problem text
  std::string created;
};

enum class SearchStatus { kPending, kRunning, kFinished, kCancelled, kFailed };
const char* SearchStatusName(SearchStatus s);
StatusOr<SearchStatus> ParseSearchStatus(const std::string& s);

struct SearchRow {
  int64_t id = 0;
  int64_t problem_id = 0;
  std::string config_json;
  SearchStatus status = SearchStatus::kPending;
  std::string stop_reason;  // "rounds", "budget: ...", "target speedup", "cancelled", error text
  std::string created;
  std::string updated;
  std::optional<int64_t> best_candidate;
  // Wall time spent on the search, summed over every process that ran part of
  // it; what a wall-time budget counts.
  double elapsed_s = 0;
};

struct IdeaRow {
  int64_t id = 0;
  int64_t search_id = 0;
  int round = 0;
  std::optional<int64_t> parent_candidate;  // the beam kernel it was proposed for
  std::string text;
  std::string slot_key;
  std::string created;
};

enum class CandidateKind { kSeed, kPrimary, kRepair };
const char* CandidateKindName(CandidateKind k);

struct EvaluationRow {
  int64_t candidate_id = 0;
  EvalStatus status = EvalStatus::kCompileError;
  std::string evaluation_json;  // EvaluationToJson
  std::optional<double> median_ms;
  std::optional<double> speedup_eager;
  std::optional<double> speedup_compile;
  // Set when this evaluation was copied from an identical candidate's.
  std::optional<int64_t> reused_from;
  std::string created;
};

struct CandidateRow {
  int64_t id = 0;
  int64_t search_id = 0;
  int round = 0;
  std::optional<int64_t> idea_id;
  std::optional<int64_t> parent_candidate;  // beam parent, or the failed candidate a repair fixes
  std::string source;
  std::string plan_json;
  std::string content_hash;  // CandidateContentHash(source, plan_json)
  bool evaluated = false;    // state: pending / evaluated
  std::string raw_response;  // the model's reply, kept when it could not be parsed
  CandidateKind kind = CandidateKind::kPrimary;
  int branch = 0;
  int repair_depth = 0;           // 0 for a first attempt, n for the n-th repair in a chain
  bool repair_attempted = false;  // a repair of this candidate was asked for
  std::string slot_key;
  std::string created;
  std::optional<EvaluationRow> evaluation;  // filled by the queries that say so
};

struct LlmCallRow {
  int64_t id = 0;
  int64_t search_id = 0;
  std::string slot_key;
  std::string prompt_sha256;
  LlmCallRecord record;
  std::string created;
};

// Totals over a search's LLM calls (failed calls included: they cost).
// One tool call of an agent's conversation (search/agent.h) and its answer.
struct AttemptRow {
  int64_t id = 0;
  int64_t search_id = 0;
  std::optional<int64_t> idea_id;
  std::string slot_key;   // the implementation it belongs to ("r0/i3/b1")
  int turn = 0;           // the model turn that made the call, from 0
  int call_index = 0;     // its place among that turn's calls
  std::string tool_call_id;
  std::string tool;       // "compile", "test", "profile", "submit", or what the model named
  std::string arguments;  // JSON as the model sent it
  std::string source;     // the candidate it carried, when it carried one
  std::string plan_json;
  std::string status;     // the evaluation status name, "tool_error" or "" (submit)
  bool is_error = false;  // answered as a tool error
  std::string result;     // what the model was told
  std::string evaluation_json;  // the practice evaluation, when one ran
  // Unused so far: the submitted candidate is the one stored under slot_key.
  std::optional<int64_t> candidate_id;
  std::string created;
};

// Tool calls of a search's agents, for `history`.
struct AttemptCounts {
  int64_t tool_calls = 0;
  int64_t tool_errors = 0;
  int64_t tests = 0;       // practice evaluations (the `test` tool; `compile` runs nothing)
  int64_t submitted = 0;
};

struct LlmSpend {
  int64_t calls = 0;
  int64_t tokens_in = 0;
  int64_t tokens_out = 0;
  double cost_usd = 0;
};

// A search as history shows it.
struct SearchSummary {
  SearchRow search;
  std::string problem_name;
  int64_t candidates = 0;
  int64_t evaluated = 0;
  int64_t correct = 0;
  int rounds = 0;  // rounds started
  std::optional<double> best_speedup_eager;
  std::optional<double> best_median_ms;
  LlmSpend spend;
  int64_t failed_calls = 0;  // model calls that returned an error (timeouts, HTTP errors)
  std::string first_llm_error;  // the first of them, "" when none
};

// A bank kernel: the best correct kernel the store holds for another problem.
struct BankEntry {
  ProblemRow problem;       // id, name and source only
  CandidateRow candidate;   // with its evaluation
};

struct RoundRow {
  int64_t search_id = 0;
  int round = 0;
  std::vector<int64_t> beam;  // candidate ids, in beam order (empty for a first round)
  bool generated = false;     // every model call of the round's first pass is done
};

// A suite: many problems searched in one resumable run. Each entry is one
// problem file, in the order given; search_id is set once its search exists,
// error when the problem failed before its search could run (bad file,
// degenerate reference) or its search ended in an error.
struct SuiteEntryRow {
  int position = 0;
  std::string file_path;
  std::optional<int64_t> search_id;
  std::string error;
};
struct SuiteRow {
  int64_t id = 0;
  std::string config_json;  // the search config every problem's search gets, and the suite's options
  SearchStatus status = SearchStatus::kPending;
  std::string created;
  std::string updated;
  std::vector<SuiteEntryRow> entries;  // by position
};

// GPU worker leases (issue 13): a pending candidate handed to a remote worker
// (kernelsearch gpu-worker) until `expires_at` (unix seconds, the server's
// clock). The lease id is a random token that only its holder knows.
struct LeasedCandidateRow {
  CandidateRow candidate;  // without its evaluation (it is pending)
  int64_t problem_id = 0;
  std::string lease_id;
  double expires_at = 0;
  int attempts = 0;        // leases this candidate has had, this one included
  std::string precision = "highest";  // its search's precision contract: the worker judges under it
  bool allow_degenerate = false;   // its search's --allow-degenerate
};

// An agent's practice call run by a GPU worker (issue 32; server/practice_calls.h):
// one compile, test or profile of a draft, on the practice input sets.
enum class PracticeTool { kCompile, kTest, kProfile };
const char* PracticeToolName(PracticeTool t);  // "compile", "test", "profile"
StatusOr<PracticeTool> ParsePracticeTool(const std::string& s);

enum class PracticeCallState { kPending, kDone, kFailed, kAbandoned };

struct PracticeCallRow {
  int64_t id = 0;
  int64_t search_id = 0;
  PracticeTool tool = PracticeTool::kTest;
  std::string source;
  std::string plan_json;
  PracticeCallState state = PracticeCallState::kPending;
  std::string result_json;  // done: EvaluationToJson (compile, test) or CounterReportToJson (profile)
  std::string error;        // failed: why
  std::string worker;       // the last worker that leased it
  int attempts = 0;         // leases it has had
};

// A leased practice call, with what the worker needs to run it.
struct LeasedPracticeCallRow {
  PracticeCallRow call;
  int64_t problem_id = 0;
  std::string lease_id;
  double expires_at = 0;
  std::string precision = "highest";
};

// Leases a practice call may have before it fails (its workers kept dying or
// giving it back): the agent waiting for it is told instead of waiting on.
inline constexpr int kMaxPracticeAttempts = 5;

// SHA-256 of what a model was asked (role, system prompt and prompt), for
// matching calls on resume.
std::string PromptHash(const std::string& role, const std::string& system, const std::string& prompt);

class LineageStore {
 public:
  struct Options {
    // Migrate only up to this version (tests build old files with it); 0 = latest.
    int max_schema_version = 0;
    int busy_timeout_ms = 10000;
    // Readers (history, show, report): a missing file is NotFound naming it,
    // rather than a new empty store that hides a typo in --db.
    bool must_exist = false;
  };

  // Opens (creating when absent, with its parent folders) and migrates.
  static StatusOr<std::unique_ptr<LineageStore>> Open(const std::string& path, const Options& options);
  static StatusOr<std::unique_ptr<LineageStore>> Open(const std::string& path) { return Open(path, Options()); }

  LineageStore(const LineageStore&) = delete;
  LineageStore& operator=(const LineageStore&) = delete;

  const std::string& path() const { return path_; }

  // How an evaluation reported by a GPU worker (CompleteLease) or handed to a
  // twin candidate (the same text, evaluated before) is stored for the
  // candidate's search: the search's own policy, from its config JSON
  // (search/search_config.h ApplySearchPolicy; the store does not know the
  // config). Called with the store's lock held: it must not use the store.
  // Unset: stored as reported.
  using EvaluationPolicy = std::function<void(const std::string& search_config_json, Evaluation& evaluation)>;
  void SetEvaluationPolicy(EvaluationPolicy policy) { policy_ = std::move(policy); }
  StatusOr<int> SchemaVersion();

  // Problems: one row per distinct source text (by SHA-256); the existing id when
  // the same text was stored before (its signature is filled in when it was "{}").
  StatusOr<int64_t> PutProblem(const ProblemRow& problem);
  StatusOr<ProblemRow> GetProblem(int64_t id);
  // Problems whose name or file path equals `name_or_path`, newest first.
  StatusOr<std::vector<ProblemRow>> FindProblems(const std::string& name_or_path);

  // Searches.
  StatusOr<int64_t> CreateSearch(int64_t problem_id, const std::string& config_json);
  StatusOr<SearchRow> GetSearch(int64_t id);
  Status SetSearchStatus(int64_t id, SearchStatus status, const std::string& stop_reason);
  // Replaces the stored config (only what describes the environment changes
  // after creation: measured GPU facts replacing datasheet or unknown ones).
  Status SetSearchConfig(int64_t id, const std::string& config_json);
  Status SetBestCandidate(int64_t search_id, std::optional<int64_t> candidate_id);
  // Adds wall time spent on the search (atomically, so that processes working
  // on the same search add up rather than overwrite).
  Status AddSearchElapsed(int64_t id, double seconds);
  // Newest first; problem_id 0 = all problems.
  StatusOr<std::vector<SearchSummary>> History(int64_t problem_id);
  StatusOr<SearchSummary> Summarize(int64_t search_id);

  // Rounds and their beams.
  StatusOr<std::optional<RoundRow>> GetRound(int64_t search_id, int round);
  // The highest round started, or nullopt before the first.
  StatusOr<std::optional<RoundRow>> LastRound(int64_t search_id);
  // Inserts the round; when it exists already, keeps (and returns) the stored beam.
  StatusOr<RoundRow> StartRound(int64_t search_id, int round, const std::vector<int64_t>& beam);
  Status MarkRoundGenerated(int64_t search_id, int round);

  // Ideas (idempotent by slot key).
  StatusOr<int64_t> PutIdea(const IdeaRow& idea);
  StatusOr<IdeaRow> GetIdea(int64_t id);
  StatusOr<std::vector<IdeaRow>> ListIdeas(int64_t search_id);
  StatusOr<std::optional<IdeaRow>> FindIdeaBySlot(int64_t search_id, const std::string& slot_key);

  // Candidates (idempotent by slot key; content_hash is computed when empty).
  StatusOr<int64_t> PutCandidate(const CandidateRow& candidate);
  StatusOr<CandidateRow> GetCandidate(int64_t id);  // with its evaluation
  StatusOr<std::optional<CandidateRow>> FindCandidateBySlot(int64_t search_id, const std::string& slot_key);
  StatusOr<std::vector<CandidateRow>> ListCandidates(int64_t search_id);  // with evaluations, by id
  // Pending candidates of a search, or of every search when search_id is 0; by id.
  StatusOr<std::vector<CandidateRow>> PendingCandidates(int64_t search_id);
  Status MarkRepairAttempted(int64_t candidate_id);
  // The path from the first kernel to this one (root first), following parent links.
  StatusOr<std::vector<CandidateRow>> Lineage(int64_t candidate_id);

  // Evaluations. Stores the evaluation and marks the candidate evaluated, in one
  // transaction; a second evaluation of the same candidate is refused.
  Status PutEvaluation(int64_t candidate_id, const Evaluation& evaluation, std::optional<int64_t> reused_from);
  // Adds hardware counters (evaluator/profile/counters.h, CounterReportToJson) to a
  // stored evaluation: they are read after the round's evaluations, for its
  // best candidates. NotFound when the candidate has no evaluation.
  Status SetEvaluationCounters(int64_t candidate_id, const nlohmann::json& counters);
  // Whether an evaluated candidate's hardware counters are wanted: it is
  // correct, has none yet, and fewer than its search's profile_top correct
  // kernels of its round are faster (GPU workers: read as results arrive).
  StatusOr<bool> WantsCounters(int64_t candidate_id);
  // An evaluated candidate of the same problem with this content hash (the
  // earliest one that was evaluated itself, not copied), for reuse.
  // Under the precision contract `precision` ("fp32", "tf32": the searches' own).
  StatusOr<std::optional<CandidateRow>> FindEvaluatedByHash(int64_t problem_id, const std::string& content_hash,
                                                            const std::string& precision);
  // Correct candidates, fastest first (median_ms, then id).
  StatusOr<std::vector<CandidateRow>> CorrectCandidates(int64_t search_id);
  StatusOr<std::optional<CandidateRow>> BestCorrect(int64_t search_id);
  StatusOr<std::optional<CandidateRow>> BestCorrectForProblem(int64_t problem_id);

  // Suites: the suite and one entry per file, in one transaction.
  StatusOr<int64_t> CreateSuite(const std::string& config_json, const std::vector<std::string>& files);
  StatusOr<SuiteRow> GetSuite(int64_t id);  // with its entries
  Status SetSuiteEntry(int64_t suite_id, int position, std::optional<int64_t> search_id, const std::string& error);
  Status SetSuiteStatus(int64_t id, SearchStatus status);

  // LLM calls.
  StatusOr<int64_t> PutLlmCall(int64_t search_id, const std::string& slot_key, const LlmCallRecord& record);

  // Agent attempts (store/attempts.cc). Put is idempotent on (search, slot,
  // turn, call): a resumed search that runs a step again keeps the first row.
  StatusOr<int64_t> PutAttempt(const AttemptRow& attempt);
  // An implementation's attempts by turn and call ("" slot: the whole search's).
  StatusOr<std::vector<AttemptRow>> ListAttempts(int64_t search_id, const std::string& slot_key = "");
  StatusOr<AttemptCounts> CountAttempts(int64_t search_id);
  // A successful call of this search with this role, prompt hash and slot key.
  StatusOr<std::optional<LlmCallRow>> FindFinishedLlmCall(int64_t search_id, const std::string& role,
                                                          const std::string& prompt_sha256,
                                                          const std::string& slot_key);
  // Every call of a search, by id (finished_only: successful ones only).
  StatusOr<std::vector<LlmCallRow>> ListLlmCalls(int64_t search_id, bool finished_only);
  StatusOr<LlmSpend> Spend(int64_t search_id);
  StatusOr<int64_t> FailedLlmCalls(int64_t search_id);

  // Device facts (search/prompts.h GpuFacts as JSON) a GPU node measured,
  // by GPU name and optionally the search it evaluated for. Latest wins.
  Status PutGpuFacts(const std::string& name, const std::string& facts_json, std::optional<int64_t> search_id);
  StatusOr<std::optional<std::string>> LatestGpuFacts(const std::string& name);
  StatusOr<std::optional<std::string>> LatestGpuFactsForSearch(int64_t search_id);

  // The kernel bank: for every problem but `exclude_problem_id`, its best
  // correct kernel (problems without one are left out); by problem id.
  StatusOr<std::vector<BankEntry>> BankCandidates(int64_t exclude_problem_id);
  // ---- GPU worker leases (issue 13) ----
  // Leases up to `max` pending candidates (oldest first) to `worker` until
  // now + lease_s: those never leased, and those whose lease expired (their
  // worker died); never those of a cancelled or failed search. One transaction, so two servers or threads never lease the
  // same candidate. A candidate identical (content hash) to one already
  // evaluated for the same problem gets that evaluation copied instead; one
  // identical to a candidate under a live lease waits for its result.
  // `prefer_problem` (0 = none): that problem's candidates come first, so a
  // worker keeps the reference it has loaded.
  StatusOr<std::vector<LeasedCandidateRow>> LeaseCandidates(const std::string& worker, int max, double lease_s,
                                                            double now, int64_t prefer_problem = 0);
  // Extends the given live leases to now + lease_s (release: ends them now, so
  // their candidates go to the next worker at once). Returns the lease ids
  // that are no longer held (expired, released, or already reported).
  StatusOr<std::vector<std::string>> RenewLeases(const std::vector<std::string>& lease_ids, double lease_s,
                                                 double now, bool release);
  // Stores the evaluation of a leased candidate, and copies it to identical
  // pending candidates of the same problem that no live lease holds, in one
  // transaction. FailedPrecondition when the lease is not live (expired,
  // released, another worker's, or already reported): so no candidate is ever
  // evaluated twice into the store. Returns the searches whose candidates got
  // an evaluation and how many candidates did.
  struct LeaseCompletion {
    int64_t stored = 0;
    std::vector<int64_t> searches;
  };
  StatusOr<LeaseCompletion> CompleteLease(int64_t candidate_id, const std::string& lease_id,
                                               const Evaluation& evaluation, double now);
  // A worker refuses to judge a leased candidate (the reference is degenerate
  // and its search does not allow that): the search fails with `reason`, the
  // lease ends, the candidate stays pending (a resume with --allow-degenerate
  // evaluates it). FailedPrecondition when the lease is not held.
  Status RefuseLease(int64_t candidate_id, const std::string& lease_id, const std::string& reason, double now,
                     int64_t* search_id);
  // Pending candidates, and how many of them a live lease holds.
  StatusOr<std::pair<int64_t, int64_t>> PendingAndLeased(int64_t search_id, double now);

  // ---- Agents' practice calls through GPU workers (issue 32; store/practice_calls.cc) ----
  // RenewLeases above renews and releases their leases too (each by the
  // length it was granted).
  // A new pending call, or the id of a pending one of the same search, tool,
  // source and plan (a resumed agent asking again, or two agents asking the
  // same): it is run once.
  StatusOr<int64_t> PutPracticeCall(int64_t search_id, PracticeTool tool, const std::string& source,
                                    const std::string& plan_json);
  StatusOr<PracticeCallRow> GetPracticeCall(int64_t id);
  // Leases up to `max` pending calls (oldest first) not under a live lease to
  // `worker` until now + lease_s; `profile` calls only when reads_counters;
  // never those of a finished, cancelled or failed search. A call that has had
  // kMaxPracticeAttempts leases fails instead (its error says so). One
  // transaction, so no call is ever held by two workers.
  StatusOr<std::vector<LeasedPracticeCallRow>> LeasePracticeCalls(const std::string& worker, int max, double lease_s,
                                                                  double now, bool reads_counters);
  // Stores a leased call's result (or, when `error` is set, its failure) and
  // ends the lease. FailedPrecondition when the lease is not live (expired,
  // released, another worker's, or already reported): nothing is stored.
  Status CompletePracticeCall(int64_t id, const std::string& lease_id, const std::string& result_json,
                              const std::string& error, double now);
  // The waiting side gave up (its deadline, the search stopping): a pending
  // call is abandoned and no worker takes it any more.
  Status AbandonPracticeCall(int64_t id);

  // Which bank kernels the prompt of (search, slot) showed.
  Status RecordBankShown(int64_t search_id, const std::string& slot_key, const std::vector<int64_t>& bank_candidates);
  StatusOr<std::vector<std::pair<std::string, int64_t>>> ListBankShown(int64_t search_id);

 private:
  LineageStore(std::string path, SqliteDbPtr db) : path_(std::move(path)), db_(std::move(db)) {}
  Status Migrate(int max_version);
  StatusOr<SqliteStmtPtr> Prepare(const std::string& sql);
  Status Exec(const std::string& sql);
  StatusOr<int64_t> PutCandidateLocked(const CandidateRow& candidate);
  Status PutEvaluationLocked(int64_t candidate_id, const Evaluation& evaluation, std::optional<int64_t> reused_from);
  Status CopyEvaluationLocked(int64_t to_candidate, int64_t from_candidate);

  const std::string path_;
  std::mutex mu_;  // guards every use of db_
  EvaluationPolicy policy_;
  // evaluation under policy_ for candidate_id's search (a copy when no policy).
  StatusOr<Evaluation> WithPolicyLocked(int64_t candidate_id, Evaluation evaluation);
  SqliteDbPtr db_;
};

}  // namespace ks::store
