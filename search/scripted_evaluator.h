// A CandidateEvaluator that needs no GPU, for tests and benchmarks of the search
// (`--evaluator fake[:CONFIG.json]` on the command line; not for real use).
// It decides each result from markers in the candidate's source:
//   FAKE_STATUS(incorrect)  any EvalStatus name; default correct
//   FAKE_MS(0.25)           the median time in ms; default 1.0
//   FAKE_LAUNCH_MS(0.1, 0.15)  each launch's own time (launch_profiles, in plan
//                           order); with FAKE_REGISTERS(32, 64) their registers per
//                           thread, from which the occupancy on an H100's SM follows
// Speedups are eager_ms / median (and compile_ms / median). Every evaluated
// candidate is counted and, when a log path is set, appended to that file as
// one line (its content hash), so that tests in other processes can check that
// nothing was evaluated twice. Faults: fail_after makes EvaluateBatch return an
// Unavailable status after that many candidates (an evaluator that broke).
// Thread-safe (a mutex guards the counters).
#pragma once

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/evaluator_api.h"
#include "search/prompts.h"

namespace ks {

struct ScriptedEvaluatorOptions {
  double eager_ms = 2.0;
  double compile_ms = 1.5;
  double delay_ms = 0;     // sleep per candidate, to stand in for GPU time
  double floor_ms = 0;     // > 0: a roofline whose floor is this time (fraction = floor / median)
  // Hardware counters to report for every profiled candidate (tests of the
  // digest reaching prompts); absent: none, with the base class's note.
  std::optional<CounterReport> counters;
  std::string log_path;    // "" = no log
  int64_t fail_after = -1; // < 0: never
  std::string device = "fake-gpu";
  // Device facts to report as if measured (tests of the facts reaching prompts).
  std::optional<GpuFacts> gpu;
  // Check the problem's reference with the real bridge on the CPU when the
  // evaluator is made (evaluator_factory.h), as the GPU evaluator does while
  // preparing its reference: tests of the GPU side's refusal of a problem that
  // cannot be judged (degenerate outputs, a nondeterministic forward).
  bool check_reference = false;
};

// Reads {"eager_ms", "compile_ms", "delay_ms", "floor_ms", "log", "fail_after", "device",
// "gpu", "check_reference"}; "gpu" is an object as in a search config's "gpu" (search_config.h).
StatusOr<ScriptedEvaluatorOptions> LoadScriptedEvaluatorOptions(const std::string& path);

class ScriptedEvaluator final : public CandidateEvaluator {
 public:
  explicit ScriptedEvaluator(ScriptedEvaluatorOptions options) : options_(std::move(options)) {}
  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) override;
  std::string DeviceName() const override { return options_.device; }
  std::vector<CounterReport> ReadCounters(const std::vector<Candidate>& candidates) override {
    if (!options_.counters) return CandidateEvaluator::ReadCounters(candidates);
    profiled_ += static_cast<int64_t>(candidates.size());
    return std::vector<CounterReport>(candidates.size(), *options_.counters);
  }
  bool CanReadCounters() const override { return options_.counters.has_value(); }
  int64_t profiled() const { return profiled_.load(); }

  int64_t evaluated() const { return evaluated_.load(); }
  int64_t batches() const { return batches_.load(); }
  // Sources evaluated so far, in order.
  std::vector<std::string> sources() const;

  // The result one source gets (pure; exposed for tests).
  Evaluation Decide(const Candidate& c) const;

 private:
  std::atomic<int64_t> profiled_{0};
  const ScriptedEvaluatorOptions options_;
  std::atomic<int64_t> evaluated_{0};
  std::atomic<int64_t> batches_{0};
  mutable std::mutex mu_;
  std::vector<std::string> sources_;
};

}  // namespace ks
