// An agent's tool calls through GPU workers (issue 32). On `kernelsearch
// serve --evaluator workers` the server has the model but no GPU: an agent's
// conversation runs here (search/agent.h), and each of its compile, test and
// profile calls becomes a row of the store's practice_calls table that a
// `kernelsearch gpu-worker` leases (before any candidate: a conversation is
// waiting), runs with a PRACTICE evaluator of the problem (never the judging
// sets) and reports. The lease is short and renewed by the worker, so a worker
// killed mid-call loses nothing: the lease expires and another worker takes
// the call. The agent waits for the result with an overall deadline.
//
//   agent (search/agent_run.cc) ─► PracticeEvaluator (a CandidateEvaluator)
//        ─► PracticeCalls::Call ─► store (pending) ─► LeaseCandidates ─► worker
//        ◄─ Poke (ReportPractice stored it) ◄────────── ReportPractice ◄─┘
//
// Ownership: borrows the store (must outlive it). One per server, shared by
// the service (WorkerSeen, Poke) and the searches' runner (Call, EvaluatorFor).
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "evaluator/evaluator_api.h"
#include "store/lineage_store.h"

namespace ks::server {

struct PracticeCallOptions {
  // How long an agent waits for one call, from the moment it is put: a worker
  // must lease it (it may be busy judging a batch, or preparing the problem's
  // practice reference) and run it. Past it the call is abandoned and the
  // agent's tool call fails saying so.
  double deadline_s = 900;
  double poll_s = 0.5;  // the store is read again this often even without a Poke
  // A worker that said it reads hardware counters counts for this long after
  // its last lease call (CanReadCounters: the agent offers `profile`).
  double worker_memory_s = 300;
};

class PracticeCalls {
 public:
  PracticeCalls(store::LineageStore* store, PracticeCallOptions options);
  PracticeCalls(const PracticeCalls&) = delete;
  PracticeCalls& operator=(const PracticeCalls&) = delete;

  // Puts the call and blocks until a worker has reported it: the result's JSON
  // (EvaluationToJson for compile and test, CounterReportToJson for profile).
  // DeadlineExceeded ("no GPU worker answered the test call within N s") past
  // the deadline, FailedPrecondition with the worker's reason when it could
  // not run it, Cancelled once `stop` is set (may be null).
  StatusOr<std::string> Call(int64_t search_id, store::PracticeTool tool, const Candidate& candidate,
                             const std::atomic<bool>* stop);

  // The agent's practice evaluator for one search: compile, test and profile
  // as calls through the workers. Lives no longer than this object.
  std::unique_ptr<CandidateEvaluator> EvaluatorFor(int64_t search_id, const std::atomic<bool>* stop);

  // The service: a worker serving practice calls asked for work.
  void WorkerSeen(bool reads_counters);
  // The service: a call's result was stored; waiters read the store now.
  void Poke();
  // Some worker serving practice calls reads hardware counters (seen lately).
  bool WorkersReadCounters() const;

  const PracticeCallOptions& options() const { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  store::LineageStore* const store_;
  const PracticeCallOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t pokes_ = 0;  // (mu_) results stored so far: a waiter that saw it change reads the store
  Clock::time_point counters_seen_{};  // (mu_) the last lease call of a worker that reads counters
};

}  // namespace ks::server
