// The GPU evaluator's timing of a correct candidate: the warm-up (batched in
// the worker, or run by run), the timed runs and when they stop, the
// per-launch profile, the series reported and the figures from it (speedups,
// the roofline). Every run here is prepared and verified as every run is.
#include "evaluator/gpu_evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "evaluator/profile/roofline.h"

#include "evaluator/gpu_evaluator_internal.h"

namespace ks {

using Clock = std::chrono::steady_clock;
using namespace gpu_internal;  // NOLINT: the evaluator's own internals

// Phase 4: warm-up, as timing.py: at least 3 runs and warmup_ms of run time,
// at most 1000 runs. Sets the estimate of one run the timed runs are counted by.
// Adaptive timing counts the judging sets' correctness runs, just made on this
// GPU, toward those 3 runs and warmup_ms (WarmUpRuns); at least one warm-up run
// is always made, on the timing set. Fewer warm-up runs can leave a candidate
// colder, never faster than it is.
std::optional<Evaluation> GpuEvaluator::WarmUpPhase(Judgement& j) {
  j.estimate_ms = std::max(Summarize(j.first_ms).median_ms, 1e-3);
  if (opts_.timing == TimingMode::kAdaptive) {
    const int runs = WarmUpRuns(j.first_ms, j.estimate_ms, opts_.warmup_ms);
    RunResult r = WarmUp(runs, j.timing_set, j.estimate_ms);
    j.KeepWorst(r.errors);
    if (r.status != EvalStatus::kCorrect)
      return FailRun(j, r, "warm-up (" + std::to_string(runs) + " runs): " + r.message, /*own_errors=*/true);
    j.run_index = runs;
  } else {
    double warm_total = 0;
    std::vector<double> warm_ms;
    for (int w = 0; w < 3 || warm_total < opts_.warmup_ms; ++w) {
      ++j.run_index;
      RunResult r = RunChecked(j, j.timing_set);
      j.KeepWorst(r.errors);
      if (r.status != EvalStatus::kCorrect)
        return FailRun(j, r, "warm-up run " + std::to_string(w) + ": " + r.message, /*own_errors=*/false);
      warm_total += r.ms;
      warm_ms.push_back(r.ms);
      if (w >= 1000) break;  // same cap as the reference's timing.py
    }
    // As timing.py does: the run count comes from the median warm-up time.
    j.estimate_ms = std::max(Summarize(warm_ms).median_ms, 1e-3);
  }
  j.Phase("warmup");
  return std::nullopt;
}

// Phase 5: timed runs, every one verified, until the planned count, a stable
// median (adaptive), a candidate clearly slower than the best, or the time cap.
std::optional<Evaluation> GpuEvaluator::TimedRuns(Judgement& j) {
  const int min_runs = opts_.timing == TimingMode::kAdaptive
                           ? MinTimedRuns(j.estimate_ms, opts_.min_timed_runs, opts_.min_timed_runs_long, opts_.long_run_ms)
                           : opts_.min_timed_runs;
  int n = static_cast<int>(std::ceil(opts_.target_timed_ms / std::max(j.estimate_ms, 1e-3)));
  n = std::clamp(n, min_runs, std::max(min_runs, opts_.max_timed_runs));
  auto phase_start = Clock::now();
  for (int i = 0; i < n; ++i) {
    ++j.run_index;
    RunResult r = RunChecked(j, j.timing_set);
    j.KeepWorst(r.errors);
    if (r.status != EvalStatus::kCorrect)
      return FailRun(j, r, "timed run " + std::to_string(i) + ": " + r.message, /*own_errors=*/true);
    j.ms.push_back(r.ms);
    j.ms_device.push_back(r.ms_device);
    const int done = static_cast<int>(j.ms.size());
    if (opts_.timing == TimingMode::kAdaptive) {
      if (TimingStable(j.ms, j.ms_device, min_runs, opts_.stable_rel, opts_.stable_abs_ms)) {
        j.stopped = "stable";
        break;
      }
      // Clearly slower than the best so far: its fastest run (on the stream,
      // the smaller figure) is far above the best median. Recorded as cut short.
      if (done >= opts_.cut_min_runs && best_ms_ > 0 &&
          *std::min_element(j.ms.begin(), j.ms.end()) > opts_.cut_factor * best_ms_) {
        j.stopped = "slower_than_best";
        break;
      }
    }
    if (done >= min_runs &&
        std::chrono::duration<double>(Clock::now() - phase_start).count() > opts_.max_eval_s) {
      j.stopped = "time_cap";
      break;
    }
  }
  j.Phase("timed");
  return std::nullopt;
}

// Phase 6: each launch on its own, in runs of their own after the timed ones.
std::optional<Evaluation> GpuEvaluator::ProfilePhase(Judgement& j) {
  const DevicePeaks* measured = peaks_ && peaks_->ok() ? &**peaks_ : nullptr;
  j.roofline = PlanRoofline(ref_.signature, bandwidth_gbps_, measured, opts_.peak_tflops, contract_);
  RunResult failed;
  auto profiles = ProfileLaunches(*j.plan, j.occupancy, j.roofline, j.timing_set, j.ms, &failed);
  if (!profiles.ok()) {
    j.KeepWorst(failed.errors);
    return FailRun(j, failed, "profile run: " + failed.message, /*own_errors=*/true);
  }
  j.e.launch_profiles = std::move(*profiles);
  j.Phase("profile");
  return std::nullopt;
}

// After the final checks: as timing.py, the on-stream series, unless work
// consistently outlived the stream; a finished candidate sets the best so far.
void GpuEvaluator::ChooseTiming(Judgement& j) {
  constexpr double kSyncSlackMs = 0.1;
  double on_stream = Summarize(j.ms).median_ms, device_wide = Summarize(j.ms_device).median_ms;
  j.e.timing = Summarize(device_wide - on_stream > kSyncSlackMs + 0.1 * on_stream ? j.ms_device : j.ms);
  j.e.timing->stopped = j.stopped;
  // Only the judge's figures set the cut's bar (a practice run is not judged).
  if (!practice_ && j.stopped != "slower_than_best" && (best_ms_ <= 0 || j.e.timing->median_ms < best_ms_))
    best_ms_ = j.e.timing->median_ms;
}

// The last phase: speedups over the reference's timings, the roofline at the
// reported median, and what the robustness checks found.
void GpuEvaluator::ReportSpeed(Judgement& j) {
  Evaluation& e = j.e;
  e.eager = ref_.eager;
  e.compiled = ref_.compiled;
  if (ref_.eager && e.timing->median_ms > 0) e.speedup_eager = ref_.eager->median_ms / e.timing->median_ms;
  if (ref_.compiled && e.timing->median_ms > 0) e.speedup_compile = ref_.compiled->median_ms / e.timing->median_ms;
  if (e.speedup_eager && e.speedup_compile) e.speedup_best = std::min(*e.speedup_eager, *e.speedup_compile);
  FinishRoofline(e.timing->median_ms, &j.roofline);
  e.roofline = j.roofline;
  e.robustness = std::move(j.robustness);
}

StatusOr<std::vector<LaunchProfile>> GpuEvaluator::ProfileLaunches(const ResolvedPlan& plan,
                                                                   const std::vector<wire::Occupancy>& occupancy,
                                                                   const Roofline& plan_roofline, int set,
                                                                   const std::vector<double>& timed_ms,
                                                                   RunResult* failed) {
  // Few runs: the events inside the plan cost a few microseconds each, and
  // these figures guide a model, they do not rank candidates. A plan of one
  // launch needs none: that launch's time is the plan's, which the timed
  // runs measured (between the same two events a split run would record).
  constexpr int kProfileRuns = 5;
  const size_t n = plan.launches.size();
  std::vector<std::vector<double>> launch_ms(n);
  const bool measured = n == 1 && !timed_ms.empty();
  if (measured) launch_ms[0] = timed_ms;
  for (int i = 0; i < kProfileRuns && !measured; ++i) {
    RunResult r = RunOnce(set, /*split=*/true);
    if (r.status != EvalStatus::kCorrect) {
      *failed = std::move(r);
      return Internal("profile run failed");
    }
    if (r.launch_ms.size() != n) {
      failed->status = EvalStatus::kRuntimeError;
      failed->message = "evaluator: the worker reported " + std::to_string(r.launch_ms.size()) +
                        " launch times for " + std::to_string(n) + " launches";
      return Internal(failed->message);
    }
    for (size_t l = 0; l < n; ++l) launch_ms[l].push_back(r.launch_ms[l]);
  }
  SmLimits sm{info_.registers_per_sm, info_.max_registers_per_block, info_.shared_per_sm,
              info_.reserved_shared_per_block, info_.max_threads_per_sm, info_.max_blocks_per_sm};
  std::vector<std::string> kernels;
  std::vector<double> bytes;
  std::vector<std::optional<Occupancy>> occ;
  for (size_t l = 0; l < n; ++l) {
    const PlannedLaunch& pl = plan.launches[l];
    kernels.push_back(pl.kernel);
    // Each distinct buffer the launch is passed, once: what it could move at
    // least if it touches all of them (a launch may touch only part of one).
    std::set<std::string> seen;
    double b = 0;
    for (const ArgValue& a : pl.args) {
      std::string name = a.name;
      if (a.kind == ArgValue::Kind::kTensorMap)  // counts as the tensor it walks
        for (const auto& m : plan.tensor_maps)
          if (m.name == a.name) name = m.tensor;
      if (!seen.insert(name).second) continue;
      if (a.kind == ArgValue::Kind::kTensor || a.kind == ArgValue::Kind::kTensorMap) {
        if (const TensorSpec* t = ref_.signature.Find(name)) b += static_cast<double>(t->bytes());
      }
      if (a.kind == ArgValue::Kind::kScratch || a.kind == ArgValue::Kind::kTensorMap) {
        for (const auto& s : plan.scratch)
          if (s.name == name) b += static_cast<double>(s.bytes);
      }
    }
    bytes.push_back(b);
    std::optional<Occupancy> o;
    if (l < occupancy.size() && occupancy[l].blocks_per_sm >= 0) {
      const wire::Occupancy& j = occupancy[l];
      Occupancy v;
      v.blocks_per_sm = j.blocks_per_sm;
      v.threads_per_block = j.threads;
      v.registers = std::max(0, j.registers);
      v.shared_bytes = std::max(0, j.static_shared) + j.dynamic_shared;
      v.cluster_size = j.cluster_size;
      v.max_active_clusters = j.max_active_clusters;
      ExplainOccupancy(sm, &v);
      o = v;
    }
    occ.push_back(o);
  }
  return BuildLaunchProfiles(kernels, launch_ms, bytes, plan_roofline.flops, plan_roofline.peak_gbps,
                             plan_roofline.peak_tflops, occ);
}

}  // namespace ks
