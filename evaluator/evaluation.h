// The evaluation of one candidate (DESIGN.md, contract 3). A kernel that fails is
// not an error: it is an Evaluation with a status other than kCorrect.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evaluator/profile/counters.h"
#include "evaluator/profile/launch_profile.h"

namespace ks {

enum class EvalStatus {
  kCompileError,
  kInvalidPlan,
  kLaunchError,
  kRuntimeError,
  kTimeout,
  kIncorrect,
  kCorrect,
};

const char* EvalStatusName(EvalStatus s);  // "compile_error", ...
StatusOr<EvalStatus> ParseEvalStatus(const std::string& s);

// What a candidate is: CUDA-C device source and a launch plan (JSON text).
struct Candidate {
  std::string source;
  std::string plan_json;
};

struct KernelResources {
  std::string kernel;
  int registers = 0;
  int static_shared_bytes = 0;
  int stack_frame_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
};

// Error figures of one output, worst over all input sets and runs.
struct OutputError {
  std::string name;
  double max_abs = 0;
  double max_rel = 0;
  double rel_norm = 0;            // ||out - ref|| / ||ref||
  int64_t mismatches = 0;         // elements outside tolerance (NaN and unwritten included)
  int64_t first_mismatch = -1;    // flat index, -1 when none
  int64_t unwritten = 0;          // elements still holding the poison pattern
  int64_t nan_mismatches = 0;     // NaN/Inf where the reference has a finite value
  int input_set = 0;              // the input set these figures come from
  // The norm rules of Tolerance (evaluator/signature.h), with the bounds held to.
  double rel_norm_bound = 0;      // 0: not checked (exact dtypes)
  int64_t considered = 0;         // elements that are not tiny (TinyFraction in signature.h)
  int64_t large_errors = 0;       // of those, relative error above large_rel
  double large_rel = 0;
  double large_share_cap = 0;     // the most large_errors / considered may be
};

struct TimingStats {
  double median_ms = 0;
  double mean_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  double stddev_ms = 0;
  int runs = 0;
  // Why the timed runs ended (candidates; empty for the reference's figures):
  // "runs" (the planned count), "stable" (the median's 95% interval was
  // narrow enough), "slower_than_best" (clearly slower than the best candidate
  // so far: cut short, fewer runs), "time_cap" (the timed phase's wall-clock cap).
  std::string stopped;
  bool cut_short() const { return stopped == "slower_than_best"; }
};

struct Roofline {
  double bytes = 0;              // bytes that must move
  double flops = 0;              // the problem's FLOPs (declared or counted), 0 when unknown
  double achieved_gbps = 0;
  double achieved_tflops = 0;
  double floor_ms = 0;           // max(memory_floor_ms, compute_floor_ms)
  double fraction_of_floor = 0;  // floor_ms / median_ms (1.0 = at the floor)
  double peak_gbps = 0;          // the measured bandwidth the floor used
  // The effective compute peak: flops / compute_floor_ms (the one class's peak
  // when the FLOPs are of one class); 0 = no compute floor.
  double peak_tflops = 0;
  std::string compute_class;     // "fp32", "bf16", "fp16", "mixed" (see roofline.h), "" when unused
  std::string bound;             // "memory" or "compute": which floor is the larger
  // Where the FLOPs came from and what the compute floor rests on (roofline.h).
  std::string flops_source;      // "FLOPS" (the problem file), "counted" (the bridge), ""
  std::string flops_note;        // why not counted / what the count leaves out
  double memory_floor_ms = 0;
  double compute_floor_ms = 0;
  std::string fp32_path;         // "3xTF32" or "fp32": the fp32 path the floor assumed
  double peak_fp32_tflops = 0;   // measured fp32 matmul (TF32 off), for the record
  double peak_tf32_tflops = 0;   // measured TF32 matmul
};

struct ResolvedLaunch {
  std::string kernel;
  int64_t grid[3] = {1, 1, 1};
  int64_t block[3] = {1, 1, 1};
  int64_t shared_bytes = 0;
};

// What held beyond the get_inputs() sets, one entry per check (issue 27): a
// candidate correct on every get_inputs() set but not on a distribution-shifted
// one is still correct, and `specialised`, so that the search can prefer the
// robust kernel and a user sees the limit before exporting it.
struct RobustnessCheck {
  std::string check;    // "get_inputs", a transform ("scale_up", "scale_down", "sign_flip", "outliers"), "shapes"
  std::string outcome;  // "held", "broke", "not_checked"
  std::string detail;   // what was checked, the failure, or why it was not checked
};

struct Robustness {
  std::vector<RobustnessCheck> checks;
  std::string broken_by;  // the first check that broke; "" when every check made held
  bool specialised() const { return !broken_by.empty(); }
  // One line: "robust: held on ..." or "specialised: ... broke it (...)".
  std::string Summary() const;
};

struct Evaluation {
  EvalStatus status = EvalStatus::kCompileError;
  std::string message;        // one line saying why (empty when correct)
  std::string compile_log;
  std::string worker_log;     // device printf and worker messages, capped
  std::vector<KernelResources> resources;
  std::vector<ResolvedLaunch> launches;
  std::vector<OutputError> errors;
  std::optional<TimingStats> timing;
  std::optional<TimingStats> eager;     // reference, same method
  std::optional<TimingStats> compiled;  // torch.compile, same method
  std::optional<double> speedup_eager;
  std::optional<double> speedup_compile;
  // Against the faster of eager and torch.compile (KernelBench-v3's figure;
  // the kernelbench contract's headline speedup).
  std::optional<double> speedup_best;
  std::optional<Roofline> roofline;
  // Each launch of the plan on its own (correct candidates on a GPU); empty
  // where not measured (evaluations stored before these existed, fakes).
  std::vector<LaunchProfile> launch_profiles;
  // Hardware counters per launch (Nsight Compute), for the candidates that
  // were profiled (`eval --profile`, the best of each search round); absent
  // where not asked for. Its note says why when none could be read.
  std::optional<CounterReport> counters;
  std::string device;
  // The NVRTC target the kernels were compiled for (sm_90a on an H100: the
  // arch-specific one, compiler.h ArchSpecificTarget); "" in older records.
  std::string target;
  double compile_s = 0;
  double eval_s = 0;
  // Where eval_s went, in order (GPU evaluations): "load", "correctness",
  // "warmup", "timed", "profile", "final_checks", "worker_start"; seconds.
  std::vector<std::pair<std::string, double>> phases;
  // Inside those phases, summed over every run of the plan (GPU evaluations;
  // issue 33's phase benchmark): "stage" (an input set copied into the arena),
  // "worker" (a run's round trip to the worker: its preparation, the plan and
  // its own checks), "kernel" (the plan's own on-stream time, part of
  // "worker"), "compare" (outputs against the reference), "inputs" (inputs and
  // parameters against their pristine copies), "guards", "final_inputs";
  // seconds. "runs" counts the runs (a batched warm-up counts its runs).
  std::vector<std::pair<std::string, double>> run_parts;
  // The precision contract (issue 27). `precision`: what the candidate is held
  // to, "fp32" (exact to fp32; the reference is computed with TF32 off) or
  // "tf32" (the tolerance widened to PyTorch's default TF32 error); "" before
  // it was recorded. `baseline`: what speedup_eager and speedup_compile are
  // against, in words. Where PyTorch's defaults use TF32 (cuDNN convolutions),
  // eager is also timed with TF32 off: eager_fp32 and speedup_eager_fp32.
  std::string precision;
  std::string baseline;
  std::optional<TimingStats> eager_fp32;
  std::optional<double> speedup_eager_fp32;
  // Correct candidates on a GPU: what held beyond the get_inputs() sets.
  // Absent for other statuses, fakes and evaluations stored before it existed.
  std::optional<Robustness> robustness;

  bool correct() const { return status == EvalStatus::kCorrect; }
  bool specialised() const { return robustness && robustness->specialised(); }
};

nlohmann::json EvaluationToJson(const Evaluation& e);
// `search --require robust`: a specialised evaluation becomes incorrect, its
// message naming the transform that broke it (the robustness stays recorded).
void RequireRobust(Evaluation& e);
// A search's robustness policy on an evaluation it stores: RequireRobust when
// it requires robust kernels; otherwise an evaluation that another search's
// policy made incorrect (reused: the same candidate text) is correct again.
// Only RequireRobust's own mark is undone (a correct evaluation's message is
// empty), never an evaluation that failed on its own.
void ApplyRobustPolicy(Evaluation& e, bool require_robust);
nlohmann::json RobustnessToJson(const Robustness& r);
Robustness RobustnessFromJson(const nlohmann::json& j);
StatusOr<Evaluation> EvaluationFromJson(const nlohmann::json& j);
nlohmann::json TimingToJson(const TimingStats& t);
TimingStats TimingFromJson(const nlohmann::json& j);

}  // namespace ks
