// The inside of one Orchestrator::Run() or EvaluatePending(): the SearchRun
// class and the helpers its files share. Internal to search/ (the surface is
// orchestrator.h). Its methods live in three files, by concern:
//   orchestrator.cc  the round loop: loading, rounds, evaluation, stopping
//   generation.cc    the prompts: parents, tried ideas and best kernels for
//                    the ideas/implement/repair prompts, model calls, replies
//   selection.cc     choosing the next round's parents and the best kernel
//   agent_run.cc     the agent mode of the implement step (search/agent.h):
//                    its model turns, practice evaluations and attempts
#pragma once

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/files.h"
#include "search/orchestrator.h"
#include "search/kernel_bank.h"
#include "search/agent.h"
#include "search/call_ledger.h"
#include "search/prompts.h"
#include "search/response_parser.h"
#include "search/slot_key.h"
#include "store/candidate_hash.h"

namespace ks {

using store::CandidateKind;
using store::CandidateRow;
using store::IdeaRow;
using store::RoundRow;
using store::SearchStatus;

namespace orchestrator_internal {

using Clock = std::chrono::steady_clock;
inline double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Timing noise: kernels within 2% of each other are tied, and the tie goes to a
// kernel from an idea the beam does not hold yet.
inline constexpr double kTieTolerance = 0.02;

inline bool Repairable(EvalStatus s) {
  return s == EvalStatus::kCompileError || s == EvalStatus::kInvalidPlan || s == EvalStatus::kLaunchError ||
         s == EvalStatus::kRuntimeError || s == EvalStatus::kIncorrect;
}

inline StatusOr<Evaluation> StoredEvaluation(const CandidateRow& c) {
  if (!c.evaluation) return Internal("candidate " + std::to_string(c.id) + " has no evaluation");
  nlohmann::json j = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  if (j.is_discarded()) return Internal("candidate " + std::to_string(c.id) + ": stored evaluation is not JSON");
  return EvaluationFromJson(j);
}

// A bounded pool of threads for model calls. Tasks may submit tasks. The owner
// waits with the run's condition variable (Outstanding() reaches 0 only when
// every task, including those submitted by tasks, has finished).
class TaskPool {
 public:
  TaskPool(int threads, std::mutex* mu, std::condition_variable* cv) : mu_(mu), cv_(cv) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~TaskPool() {
    {
      std::lock_guard<std::mutex> lock(*mu_);
      stop_ = true;
    }
    cv_->notify_all();
    for (auto& t : threads_) t.join();
  }
  // Call with *mu_ held.
  void SubmitLocked(std::function<void()> task) {
    queue_.push_back(std::move(task));
    ++outstanding_;
    cv_->notify_all();
  }
  int OutstandingLocked() const { return outstanding_; }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(*mu_);
    for (;;) {
      cv_->wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      --outstanding_;
      cv_->notify_all();
    }
  }
  std::mutex* mu_;
  std::condition_variable* cv_;
  std::deque<std::function<void()>> queue_;
  int outstanding_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace orchestrator_internal

using namespace orchestrator_internal;  // NOLINT: within search/'s orchestrator files only

// One Run() or EvaluatePending() of one search: the state shared by the Run
// thread and the pool's tasks. mu_ guards every member marked (mu_). Its
// model calls go through ledger_, which it serves as their budget.
class Orchestrator::SearchRun final : private CallBudget {
 public:
  SearchRun(Orchestrator* o, int64_t search_id)
      : o_(o), store_(o->deps_.store), search_id_(search_id), ledger_(store_, search_id_, this) {}

  Status Load();

  // The device facts a GPU node measured and stored (evaluate-pending, or an
  // evaluator of an earlier run) replace the ones fixed at creation when the
  // latter were not measured (a split search created with --gpu NAME before any
  // GPU node reported): first those recorded for this search, else the latest
  // for the GPU's name.
  Status LoadMeasuredFacts();

  StatusOr<SearchOutcome> Run(Mode mode);

  StatusOr<SearchOutcome> EvaluateOnly();

 private:
  // ---- the round loop ----

  Status Loop(Mode mode);

  // A round is complete when its first pass was generated, nothing is pending
  // and no failed candidate still waits for a repair.
  StatusOr<bool> RoundComplete(const RoundRow& round);

  bool RepairEligible(const CandidateRow& c) const;

  Status ProcessRound(const RoundRow& round, Mode mode, bool* generated_something);

  // For each complete round 0..last, why it failed the search, or "" when it
  // did not: it produced no parsable candidate, and either every model call it
  // made failed (the model cannot be reached, or refuses us) or no earlier
  // round had a parsable candidate (the model does not answer with kernels).
  // `--resume` (with another --model) then starts a new round, and the rounds
  // limit does not count failed rounds. One read of the store for all rounds.
  StatusOr<std::vector<std::string>> RoundFailures(int last);

  // ---- beam selection ----

  StatusOr<std::vector<int64_t>> SelectBeam();

  // ---- generation tasks ----

  Status SubmitFirstPass(const RoundRow& round);

  Status SubmitRepairs();

  // Runs a task body; a Status error (the store failing) stops the search.
  void Guard(const std::function<Status()>& body);

  // What the prompts show of a parent kernel.
  StatusOr<ParentKernel> Parent(std::optional<int64_t> parent_id);

  // Ideas tried in the lineage of `parent` before round `round`, with what came
  // of each. Ordered by round and text, never by id, so that the prompt is the
  // same in every run of the search.
  StatusOr<std::vector<TriedIdea>> TriedIdeas(int64_t parent, int round);

  // The fastest correct kernels of this search from rounds before `round`,
  // with their ideas and figures; ties by id, so the prompt is the same in
  // every run of the search.
  StatusOr<std::vector<TopKernel>> BestKernels(int64_t parent, int round);

  Status IdeasTask(int round, int64_t parent);

  Status ImplementTask(const IdeaRow& idea, std::optional<int64_t> parent, int branch);

  // The lineage keeps which bank kernels the prompt of `slot` showed.
  Status RecordBank(const std::string& slot);

  Status RepairTask(const CandidateRow& failed);

  // Stores a candidate from a model's reply: pending when it parsed, otherwise
  // evaluated at once as a compile error carrying the parser's reason (a reply
  // without a kernel is a failed candidate, which a repair may fix).
  Status StoreReply(CandidateRow c, const std::string& reply);

  void CandidateStored(int64_t id, int64_t idea_id, bool pending);

  Status MarkInterrupted();

  // ---- model calls ----

  // The reply of a one-shot model call, through ledger_: found in the store
  // (a resumed search), or made and stored. nullopt when the call failed
  // (stored with its error) or was refused because a budget is spent or the
  // search is stopping (*refused).
  StatusOr<std::optional<std::string>> Call(const RenderedPrompt& prompt, const std::string& role,
                                            const std::string& slot, bool first_pass, bool* refused = nullptr);

  // CallBudget, for ledger_: the search's budgets and call counters.
  // Reserves a model call against the budgets; false (and *refused) when a
  // budget is spent or the search is stopping.
  bool ReserveCall(bool first_pass, bool* refused) override;
  void CallReused() override;
  // Adds up a stored call's spend, and counts it when it failed.
  Status CallRecorded(const std::string& role, const Status& status, bool first_pass,
                      const LlmCallRecord& record) override;

  std::string BudgetSpentLocked() const;

  // ---- agent mode (agent_run.cc) ----

  // One implementation as an agent's conversation; stores the candidate it
  // ends with under `slot`, as the one-shot step does.
  Status AgentImplement(const IdeaRow& idea, std::optional<int64_t> parent, int branch,
                        const RenderedPrompt& prompt, const std::string& slot);
  class AgentHostImpl;

  // ---- evaluation ----

  // Evaluates everything pending in the search, identical candidates once;
  // returns how many candidates got an evaluation.
  StatusOr<int64_t> EvaluateBatch();

  // Adds the wall time since the last save to the search's stored total (Run
  // thread only). Saved after every evaluated batch and at the end, so that a
  // killed process loses at most the time since its last batch.
  Status SaveElapsed();

  void Evaluated(int round, int64_t id, const Evaluation& e, bool reused);

  Status UpdateBest();

  // Hardware counters (evaluator/profile/counters.h) of the config_.profile_top
  // fastest correct candidates of each of `rounds` not read yet, once the
  // round is evaluated: the kernels the next round's prompts show. Stored with
  // their evaluations; where they cannot be read, a note says why, once.
  Status ReadCountersOfBest(const std::set<int>& rounds);

  // ---- stopping and finishing ----

  bool Cancelled() const { return o_->cancelled(); }
  // No new model calls: cancelled, a budget spent, the target reached, or a task failed.
  bool Stopping();
  bool StoppingLocked();

  std::optional<double> BestSpeedup();

  Status Done(const std::string& reason);

  StatusOr<SearchOutcome> Finish();

  SearchOutcome Outcome();

  void Emit(SearchEvent e);

  Orchestrator* const o_;
  store::LineageStore* const store_;
  const int64_t search_id_;
  CallLedger ledger_;  // every model call of the run
  store::SearchRow search_;
  SearchConfig config_;
  ProblemContext problem_;
  Clock::time_point start_;
  Clock::time_point elapsed_mark_;  // Run thread only: when elapsed time was last saved
  double prior_elapsed_s_ = 0;      // spent on the search by earlier processes (as loaded)
  std::atomic<int> round_{-1};

  std::mutex mu_;
  std::condition_variable cv_;
  std::mutex emit_mu_;  // serializes the event callback
  std::unique_ptr<TaskPool> pool_;
  Status fatal_;                       // (mu_) the first error of a task
  std::string stop_reason_;            // (mu_) budget or target: no new model calls
  std::string generate_only_note_;
  std::string failure_;                // (mu_) a round failed the search (RoundFailure)
  int judged_round_ = -1;              // a round this run does not judge again (the search failed on it before)
  bool finished_ = false;              // (mu_)
  bool first_pass_interrupted_ = false;  // (mu_)
  int64_t pending_signal_ = 0;         // (mu_) candidates stored since the last batch
  int64_t generated_count_ = 0;        // (mu_) candidates stored by this round's processing
  std::set<int64_t> repairs_submitted_;  // (mu_)
  store::LlmSpend spend_;              // (mu_) search-wide
  int64_t calls_now_ = 0;              // (mu_)
  int64_t calls_reused_ = 0;           // (mu_)
  int64_t llm_failed_now_ = 0;         // (mu_)
  std::string first_llm_error_;        // (mu_)
  std::vector<BankKernel> bank_;       // fixed by Load()
  int64_t evaluated_total_ = 0;        // (mu_)
  int64_t failed_total_ = 0;           // (mu_)
  int64_t evaluated_now_ = 0;          // (mu_)
  std::optional<int64_t> best_id_;     // written by the Run thread only
  std::optional<double> best_speedup_;  // (mu_) for readers on other threads
  double evaluator_s_ = 0;             // Run thread only
  double counters_s_ = 0;              // Run thread only: of evaluator_s_, reading hardware counters
  std::set<int64_t> counters_read_;    // Run thread only: candidates profiled by this process
  std::string counters_note_;          // Run thread only: the last "no counters" note emitted
  double llm_wait_s_ = 0;              // (mu_)
  // The GPU's, in agent mode: the practice evaluator (agents run on several
  // threads) and the judging one share the GPU, and a practice run must not
  // overlap a judged candidate's timed runs. Held around every practice call
  // and every judging batch (and counter read) of a search with agents.
  std::mutex practice_mu_;
};

}  // namespace ks
