// `kernelsearch gpu-worker`: evaluates candidates for a `kernelsearch serve`
// elsewhere (issue 13). Placed by Slurm (deploy/slurm) or Kubernetes
// (deploy/k8s) on GPU nodes that need to reach nothing but the server.
//
// One thread per GPU, each with its own evaluator per problem (created for its
// device; a GPU serves one candidate batch at a time, so timings are never
// disturbed by work on the same GPU; the reference bridge, which runs on
// device 0, never overlaps device 0's timing). Each thread loops: lease up to `batch`
// pending candidates → prepare the problem's reference from the source the
// server sent (kept for the next candidates of the same problem) → evaluate →
// report each result with its lease id. A renewer thread extends every held
// lease each lease/3 seconds; a lease the server says is lost is not reported.
// A worker that dies simply stops renewing: its leases expire and the server
// hands the candidates to another worker. Stop() releases held leases at once.
//
// Agents' practice calls (issue 32): the server's agents (search/agent.h)
// compile, test and profile their drafts through the workers. A lease call
// returns those first (server/practice_calls.h); each GPU thread runs them
// with the PRACTICE evaluator of the problem (practice input sets from their
// own seed, no reference values; orchestrator_runner.h
// StoredProblemEvaluators), made beside its judging evaluator and kept with
// it, and reports each result (ReportPractice) under its short lease, which
// the renewer keeps alive.
//
// Ownership: owns its client, evaluators and threads. Thread-safety: Run() once,
// from one thread; Stop() from any thread (a signal handler thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/judge/judge.h"
#include "search/evaluator_factory.h"
#include "server/client.h"

namespace ks::server {

struct GpuWorkerOptions {
  ClientOptions client;          // the server, its token, TLS
  EvaluatorOptions evaluator;    // spec "gpu" or "fake[:FILE]", python; `device` ignored
  std::vector<int> devices{0};   // one evaluating thread per device
  std::string name;              // "" = host/pid (plus the Slurm job id, when set)
  double lease_s = 0;            // 0 = the server's default
  int batch = 1;                 // candidates leased per GPU per call
  double idle_poll_s = 2;        // pause when nothing is pending
  // Exit once every GPU found nothing to do for this long (0 = never): a
  // Slurm job that ends when the queue is empty.
  double exit_when_idle_s = 0;
  bool quiet = false;
};

struct GpuWorkerStats {
  int64_t leased = 0;
  int64_t reported = 0;
  int64_t lost = 0;  // results dropped because the lease was lost
  int64_t practice = 0;  // agents' practice calls answered (issue 32)
};

class GpuWorker {
 public:
  explicit GpuWorker(GpuWorkerOptions options);
  ~GpuWorker();
  GpuWorker(const GpuWorker&) = delete;
  GpuWorker& operator=(const GpuWorker&) = delete;

  // Blocks until Stop(), the idle timeout, or a fatal error (the server refused
  // the token or the request). Transient errors (the server restarting) are
  // retried with back-off.
  Status Run();
  // Stops taking work and gives the held leases back to the server, so that
  // their candidates go to another worker at once. Returns the number released.
  int Stop();
  GpuWorkerStats stats() const;

 private:
  struct LoadedProblem;  // a GPU thread's evaluators and what they were made for

  void ServeDevice(int device);
  // Takes the leases of a lease answer: held (renewed) until reported.
  void Hold(const ::kernelsearch::v1::LeaseCandidatesResponse& resp);
  // Makes (or keeps) the evaluators of `problem` under `precision` on
  // `device`, with the agents' practice evaluator when `practice`.
  Status Load(int device, const std::string& problem_id, const ::kernelsearch::v1::LeasedProblem& problem,
              Contract precision, bool practice, LoadedProblem* loaded, std::string* facts_json);
  // Judges a lease answer's candidates, problem by problem, and reports each.
  void JudgeCandidates(int device, const ::kernelsearch::v1::LeaseCandidatesResponse& resp, LoadedProblem* loaded,
                       std::string* facts_json);
  // Runs a lease answer's practice calls in order and reports each; a call
  // this GPU failed to run goes back to the server.
  void ServePractice(int device, const ::kernelsearch::v1::LeaseCandidatesResponse& resp, LoadedProblem* loaded,
                     std::string* facts_json);
  // One practice call's result as JSON (EvaluationToJson, CounterReportToJson).
  StatusOr<std::string> RunPractice(int device, CandidateEvaluator* evaluator,
                                    const ::kernelsearch::v1::LeasedPracticeCall& call);
  // Sends a practice call's result while its lease is held, retrying a briefly absent server.
  void ReportPractice(const ::kernelsearch::v1::LeasedPracticeCall& call,
                      ::kernelsearch::v1::ReportPracticeRequest& rep);
  void RenewLoop();
  bool Held(const std::string& lease_id);
  void Drop(const std::vector<std::string>& lease_ids);
  // Gives leases back to the server now (failing that, they expire) and forgets them.
  void GiveBack(const std::vector<std::string>& lease_ids);
  // Sends one report (an evaluation or a refusal) for leased candidate c
  // while its lease is held, retrying a briefly absent server; counts it.
  // The server's answer, or nothing when it was not stored.
  std::optional<::kernelsearch::v1::ReportEvaluationResponse> Report(const std::string& who,
                                                                     const ::kernelsearch::v1::LeasedCandidate* c,
                                                                     ::kernelsearch::v1::ReportEvaluationRequest& rep);
  // Reads the hardware counters of candidates the server asked for (on this
  // device, not while device 0 prepares a reference) and sends them.
  void SendCounters(int device, CandidateEvaluator* evaluator,
                    const std::vector<const ::kernelsearch::v1::LeasedCandidate*>& cands,
                    const std::vector<Candidate>& batch);
  void Log(const std::string& line) const;
  void Fail(const Status& st);
  bool SleepUnlessStopped(double seconds);

  GpuWorkerOptions options_;
  std::atomic<bool> stop_{false};
  // The reference bridge computes on CUDA device 0 (evaluator/problem.h), so
  // preparing a problem (exclusive) and timing candidates on device 0 (shared)
  // never overlap; preparations also run one at a time, so that the GPUs
  // after the first find the reference in the cache instead of computing it
  // again at once.
  std::shared_mutex prepare_mu_;
  mutable std::mutex mu_;  // guards the fields below
  std::unique_ptr<Client> client_;  // set once by Run(); thread-safe itself
  double lease_s_ = 0;  // the length the server granted (its answer to the first lease)
  double practice_lease_s_ = 0;  // the (shorter) length of practice calls' leases, once one was granted
  bool renew_now_ = false;  // a shorter lease came: the renewer recomputes its period
  std::condition_variable cv_;
  std::set<std::string> held_;  // live lease ids
  Status fatal_;
  GpuWorkerStats stats_;
  int idle_devices_ = 0;
  // The evaluators here read hardware counters (asked up front, then what
  // every evaluator made says): the server then gives this worker `profile` calls.
  std::atomic<bool> reads_counters_{false};
};

// "host/pid", with "/slurm-JOB[_TASK]" when run by Slurm.
std::string DefaultWorkerName();

}  // namespace ks::server
