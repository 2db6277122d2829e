// Every GPU of a host behind one CandidateEvaluator (`--gpus all|0,1,..`): a
// pool of member evaluators, one per GPU, each created for its device and used
// by one thread at a time, so that a candidate's timing is never disturbed by
// another candidate on the same GPU. A batch is split into chunks that go to
// whichever member is free (guided self-scheduling: a chunk is the remaining
// work over twice the members, at least one candidate), so a large batch keeps
// each member's own compile parallelism and the tail stays balanced. Results
// come back in input order, exactly as the members produced them.
//
// Faults: a member whose EvaluateBatch fails (its GPU fell over) is retired
// for the pool's life and its chunk goes to the others; only when every member
// is retired does the batch fail, with the last member's error.
//
// Ownership: owns its members. Thread-safety: EvaluateBatch may be called from
// several threads at once (a member serves one chunk at a time).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/evaluator_api.h"

namespace ks {

// The GPUs named by `--gpus`: "all" (every device of `device_count`), or a
// comma-separated list of distinct ordinals below it ("0,1"). InvalidArgument
// naming the bad entry otherwise. `device_count` < 0 means unknown (a fake
// evaluator): any non-negative ordinal is taken, and "all" is device 0.
StatusOr<std::vector<int>> ParseGpuList(const std::string& text, int device_count);

// A GPU evaluator makes driver calls (verification, profiling) on the thread
// that calls it, with its device's primary context current; in a pool that is
// not the thread that created it. This wrapper makes the device's primary
// context current on the calling thread around every call and around the
// wrapped evaluator's destruction. Thread-safety: as the wrapped evaluator.
class DeviceBoundEvaluator final : public CandidateEvaluator {
 public:
  DeviceBoundEvaluator(std::unique_ptr<CandidateEvaluator> inner, int device)
      : inner_(std::move(inner)), device_(device) {}
  ~DeviceBoundEvaluator() override;
  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) override;
  std::vector<CounterReport> ReadCounters(const std::vector<Candidate>& candidates) override;
  std::string DeviceName() const override { return inner_->DeviceName(); }

 private:
  std::unique_ptr<CandidateEvaluator> inner_;
  const int device_;
};

class EvaluatorPool final : public CandidateEvaluator {
 public:
  // `members` must not be empty; member i is reported as `labels[i]` in errors
  // (e.g. "gpu 3"); missing labels read "member i".
  explicit EvaluatorPool(std::vector<std::unique_ptr<CandidateEvaluator>> members,
                         std::vector<std::string> labels = {});
  EvaluatorPool(const EvaluatorPool&) = delete;
  EvaluatorPool& operator=(const EvaluatorPool&) = delete;

  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) override;
  // On the first member that is not retired (GPUs of one host are alike).
  std::vector<CounterReport> ReadCounters(const std::vector<Candidate>& candidates) override;
  // The first member's device (members of one pool are GPUs of one host).
  std::string DeviceName() const override;

  size_t size() const { return members_.size(); }
  // Members not retired.
  size_t healthy() const;
  // Candidates each member has evaluated so far (for tests and --verbose).
  std::vector<int64_t> evaluated_per_member() const;

  // Builds one member per device with `make` in parallel (each GPU's setup
  // takes seconds); the first error wins, naming the device.
  static StatusOr<std::unique_ptr<EvaluatorPool>> Create(
      const std::vector<int>& devices,
      const std::function<StatusOr<std::unique_ptr<CandidateEvaluator>>(int device)>& make);

 private:
  struct Member {
    std::unique_ptr<CandidateEvaluator> evaluator;
    std::string label;
    bool busy = false;
    bool retired = false;
    int64_t evaluated = 0;
  };
  // Blocks until a member is free; -1 when every member is retired.
  int Acquire();
  void Release(int index, bool retire, int64_t evaluated);

  std::vector<Member> members_;
  mutable std::mutex mu_;  // guards the members' busy/retired/evaluated
  std::condition_variable free_cv_;
};

}  // namespace ks
