// The trusted GPU evaluator (DESIGN.md, "Evaluator rules"). One per problem and
// GPU. It owns:
//  - the reference: K input sets, parameters and reference outputs loaded once
//    into device memory of this process. Reference outputs never leave it.
//  - a shared arena (CUDA IPC) holding the working inputs, parameters and output
//    buffers the candidate sees, plus a pristine copy of the inputs to detect
//    modification, and guard regions around outputs (Arena, evaluator/arena.h);
//  - the sandboxed worker process (ks-worker serve) that runs candidates
//    (WorkerClient, evaluator/worker/worker_client.h). A crash or hang ends
//    only the worker, which is restarted for the next candidate.
// Every checked or timed run of a candidate is prepared identically (globals
// restored, scratch refilled, outputs poisoned, L2 flushed), timed with device
// events and verified here, so a candidate cannot behave differently when
// timed. Warm-up runs (adaptive timing) are prepared the same way but for the
// flush and the pad, run back to back in one worker request, and checked
// together after the last: its outputs, every input set, guards, globals,
// scratch. Nothing a warm-up run could leave behind survives into a timed run.
//
// A candidate correct on every get_inputs() set runs once more on each
// distribution-shifted set (ReferenceSet::transform: inputs scaled, negated,
// with outliers; gpu_evaluator_robust.cc). Stops a kernel specialised to
// get_inputs()'s distribution (fp16-split fp32, an unguarded exp) passing
// unmarked: it stays correct, marked specialised (Evaluation::robustness).
// Shifted sets are never warmed up on or timed.
//
// No state survives between runs, by construction (issue 31): every checked
// or timed run starts from device state the candidate cannot have written.
// (Warm-up runs, back to back in one worker request, are neither timed nor,
// but for the last, checked: what one leaves for the next decides nothing,
// and the last one, which is checked, is isolated from all of them.) The module is
// loaded afresh, every allocation it can reach is restored in full, local
// and shared memory are scrubbed; so a memo has nowhere to live, keyed by
// pointer or by input content alike. Every place a kernel can write, and how
// it is reset or verified between runs:
//  - module-scope state of every kind (__device__, __managed__, __constant__
//    stores, .global variables declared in inline PTX): the module is
//    unloaded and loaded again from its image before every run but the
//    first (ks-worker Reload); globals the PTX lists must also hold their
//    load-time values after each run (a candidate that writes one is told so);
//  - the arena, which holds ONE input set at a time (StageSet: copied from
//    the pristine copy in trusted memory, never mapped by the worker, at the
//    same addresses for every set): no kernel can read another set, so none
//    can relate a shifted set to the set it was made from, nor tell sets
//    apart by address. Its pages are covered in full:
//     - outputs: poisoned (a NaN pattern) before each run; every element must
//       be written, and must match the reference (element-wise, relative norm
//       and large-error share, Tolerance in signature.h); repeated runs on one
//       input set must agree bit for bit unless the kernel uses atomics;
//     - guards: before the first buffer, and after each output from its last
//       byte (alignment padding included); the last one runs to the end of the
//       arena's last 2 MiB page; checked after every run;
//     - inputs and parameters of the staged set, padding included: compared
//       with the pristine copy after every run, restored if changed;
//  - scratch: allocations of whole 2 MiB pages, [guard][data][guard to the
//    end]: data refilled with junk (NaN words) before each run, both guards
//    checked after (ks-worker), so no slack past a guard keeps anything;
//  - local memory (stacks, spills, arrays never initialised): every warp
//    slot's local window overwritten before each run by ks_scrub_local, as
//    many blocks as fit at once on every SM, the frame as large as the
//    largest any loaded kernel needs (at most 64 KiB per thread; larger is a
//    launch_error);
//  - shared memory: one block per SM holding the opt-in maximum overwrites it
//    before each run (ks_scrub_shared in ks-worker);
//  - the device malloc heap: malloc/free/new refused at compile time
//    (compiler.cc), and the worker's heap limit set to the minimum;
//  - the L2 flush buffer and the scrub's counter: the worker's own page-sized
//    allocations, rewritten in full before every run;
//  - device printf FIFO: capped, and only a log, never an answer;
//  - TMA tensor maps (the plan's "tensor_maps"): built by the worker from the
//    plan, and checked first to walk only inside the tensor or scratch
//    buffer they name (plan/tensor_map.h), so a TMA store reaches only what
//    an ordinary store through that pointer could;
//  - the profiled run (hardware counters, gpu_evaluator_counters.cc): a second
//    worker under ncu, its run prepared and verified as every run is and
//    followed by the check of the staged set; it decides nothing about the
//    candidate (a wrong profiled run only drops its counters).
// The order of the checked sets (get_inputs() and shifted sets together) is
// drawn at random per candidate (CheckCorrectness), and so is the set the
// timed runs use.
// What cannot be stopped here, and why:
//  - driver-owned memory of the worker's context (the printf FIFO, the
//    minimal heap, code) at addresses no plan names: reaching it takes a
//    wild pointer outside every buffer, which faults in all but unlucky
//    layouts; nothing the evaluator gives a kernel points there;
//  - a race that never shows within the runs checked (at least one per set,
//    the last warm-up run and every timed run) passes, as it would in PyTorch.
// The "slower than best" cut of timed runs (TimedRuns) rests on best_ms(),
// which only a candidate whose every run passed these checks sets; a cut
// changes no verdict and no figure's method, only how many timed runs a
// clearly slower candidate gets (at least cut_min_runs, each verified).
//
// Not thread-safe: one caller at a time (GPU work is serialized per GPU);
// EvaluateBatch compiles in parallel internally.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "evaluator/arena.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/compile/helper_cache.h"
#include "evaluator/profile/counters.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/evaluator_api.h"
#include "evaluator/plan/launch_plan.h"
#include "evaluator/worker/worker_client.h"
#include "evaluator/worker/worker_protocol.h"
#include "evaluator/judge/judge.h"
#include "evaluator/profile/launch_profile.h"
#include "evaluator/problem.h"

namespace ks {

// How a candidate's timed runs are chosen (the method of each run is the same).
enum class TimingMode {
  // Warm-up runs batched in the worker (one synchronize, outputs of the last
  // run and every input set verified after them); timed runs stop once the
  // median is stable, or early for a candidate clearly slower than the best so far.
  kAdaptive,
  // Every warm-up run verified on its own, and the full planned count of timed
  // runs: the method before adaptive timing, kept for comparison (--timing full).
  kFull,
};

struct GpuEvaluatorOptions {
  int device = 0;
  // Whether a wrong output's message names the reference's value at the
  // first wrong element ("got X, expected Y"). Off for an agent's practice
  // evaluator: its tools give error figures only, never reference values.
  bool reveal_reference_values = true;
  std::string worker_path;          // "" = FindWorker
  double run_timeout_s = 0;         // one run of the plan; 0 = auto: 200x the eager median, within 2..60 s
  double compile_timeout_s = 60;
  int compile_threads = 0;          // parallel compiles; 0 = one per CPU core but one
  double target_timed_ms = 1000;    // timing: runs = clamp(target / estimate, min, max)
  int min_timed_runs = 10;
  // Adaptive, runs of long_run_ms or more: at least this many timed runs
  // (then the stable-median rule below decides). A run that long varies by
  // microseconds, a fraction of a percent, so five runs within the rule's
  // band are as good as ten; shorter runs keep min_timed_runs (issue 33).
  int min_timed_runs_long = 5;
  double long_run_ms = 1.0;
  int max_timed_runs = 200;
  double warmup_ms = 25;            // and at least 3 warm-up runs
  double max_eval_s = 20;           // wall-clock cap on the timed phase of one candidate
  TimingMode timing = TimingMode::kAdaptive;
  // Adaptive: stop once the 95% confidence interval of the median (from order
  // statistics) has a half-width within stable_rel of the median, or within
  // stable_abs_ms (the resolution of event timing) for very short runs.
  double stable_rel = 0.005;
  double stable_abs_ms = 0.001;
  // Adaptive: after cut_min_runs timed runs, a candidate whose fastest run is
  // above cut_factor x the best median this evaluator has measured is cut short.
  int cut_min_runs = 5;
  double cut_factor = 1.5;
  bool drop_privileges = true;      // the worker runs as nobody when we are root
  size_t worker_log_cap = 64 * 1024;
  double peak_tflops = 0;           // compute peak for the roofline; 0 = the measured peak (below)
  bool measure_peaks = true;        // for a problem with FLOPS: measure (once per GPU, cached) the
                                    // matmul peak of its compute class (MeasureDevicePeaks)
  std::string python;               // the interpreter for that measurement; "" = ResolvePython's order
  std::string target;               // NVRTC target; "" = the device's arch-specific one (sm_90a on 9.0)
  // Where the helper kernels' cubin is kept between commands
  // (evaluator/compile/helper_cache.h); "" = compiled once per process.
  std::string helper_cache_dir;
  // The precision contract (Evaluation::precision; evaluator/judge/judge.h):
  // "highest", "high", "medium" or "kernelbench" ("fp32" and "tf32" are
  // aliases of highest and high).
  std::string precision = "highest";
};

// Compile threads for each of `gpus` evaluators of one host: the CPU cores but
// one, shared equally (each evaluator compiles its own candidates ahead of its GPU).
int CompileThreadsPerGpu(size_t gpus);

class GpuEvaluator : public CandidateEvaluator {
 public:
  // Loads the reference onto the GPU and starts a worker. FailedPrecondition
  // when there is no GPU.
  static StatusOr<std::unique_ptr<GpuEvaluator>> Create(const ReferenceData& ref, const GpuEvaluatorOptions& opts);
  ~GpuEvaluator() override;

  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) override;
  // NVRTC and the plan's resolution against the signature: CPU work, no GPU run.
  StatusOr<Evaluation> CompileOnly(const Candidate& candidate) override;
  std::string DeviceName() const override { return info_.name; }

  // One candidate already compiled (the batch path calls this in order),
  // through the phases listed below under Judgement.
  Evaluation EvaluateCompiled(const Candidate& candidate, const CompileResult& compiled);

  const DeviceInfo& device_info() const { return info_; }
  double measured_bandwidth_gbps() const { return bandwidth_gbps_; }
  // This GPU's measured matmul peaks: measured at Create for a problem that
  // declares FLOPS, or on the first call here (cached per GPU on disk).
  // An error leaves the roofline with its bandwidth floor only.
  StatusOr<DevicePeaks> Peaks();
  // Hardware counters of each candidate's launches (evaluator/profile/counters.h):
  // compiled again, then one more run in a worker started under Nsight
  // Compute, prepared and verified as every run is. Never fails: where the
  // counters cannot be read, each report's note says why (and, once ncu is
  // known not to work here, without trying again).
  std::vector<CounterReport> ReadCounters(const std::vector<Candidate>& candidates) override;
  bool CanReadCounters() const override { return !FindNcu().empty(); }
  int worker_restarts() const { return worker_.restarts(); }
  // The device malloc heap the worker's context was left with (as small as the driver allows).
  uint64_t worker_heap_bytes() const { return worker_.heap_bytes(); }
  // Whether this evaluator holds its own copy of a resident reference (it is
  // on another GPU than the bridge's) rather than mapping the bridge's tensors.
  bool copies_resident() const { return own_copy_; }
  int sets() const { return static_cast<int>(ref_.sets.size()); }
  // Setup's steps as they ran, in order, with their wall seconds ("context",
  // "helper kernels (compile)" or "(from memory|disk)", "arena (...)",
  // "bandwidth probe", "peaks", "other shapes", "worker start", ...; the
  // measuring steps only where they ran).
  const std::vector<std::pair<std::string, double>>& setup_phases() const { return setup_phases_; }

  // An agent's practice (search/agent.h), in the judging evaluator's own
  // memory: its arena, worker and parameters, on the reference's practice
  // sets (ReferenceOptions::practice_sets: other seeds, never judged). One
  // GPU memory budget serves judging and practice, and a practice set costs
  // only its inputs' pristine copy and its reference outputs.
  // EvaluatePractice judges each candidate as EvaluateBatch does (every
  // check of every run, timing), on the practice sets only: no shifted sets
  // or other shapes (those belong to the judge), messages without reference
  // values, and best_ms() untouched. FailedPrecondition without practice sets.
  StatusOr<std::vector<Evaluation>> EvaluatePractice(const std::vector<Candidate>& candidates);
  // ReadCounters with the profiled run on a practice set.
  std::vector<CounterReport> ReadPracticeCounters(const std::vector<Candidate>& candidates);
  bool has_practice_sets() const { return !ref_.PracticeSets().empty(); }
  // A CandidateEvaluator whose EvaluateBatch and ReadCounters are the two
  // above (CompileOnly and CanReadCounters this one's). It must not outlive
  // this evaluator, and shares its one-caller-at-a-time rule.
  std::unique_ptr<CandidateEvaluator> PracticeView();
  // The best median of a correct candidate so far (0 before the first).
  double best_ms() const { return best_ms_; }

 private:
  using TensorSlot = Arena::TensorSlot;
  using StagedSlot = Arena::StagedSlot;
  // An output of the signature: its place in the arena (Arena::OutputRegion,
  // copied at Setup) and its reference, which stays in trusted memory here.
  struct OutputSlot {
    const TensorSpec* spec = nullptr;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint64_t guard_offset = 0;       // right after the last byte: alignment padding is guard too
    uint64_t guard_bytes = 0;
    std::vector<CUdeviceptr> refs;   // one per input set; trusted memory only:
    std::vector<DeviceBuffer> ref_buffers;  // ours (from files), or the resident bridge's (mapped)
    std::vector<double> ref_rms;     // per input set: RMS of the finite reference values
    // Per input set: the per-block bound under the contract (judge.h
    // CombineBounds), where the set's truth is float64; empty buffers elsewhere.
    std::vector<DeviceBuffer> bounds;
    // Per input set: the relative error norm an output would have with every
    // element at its block's bound (the norm rule's widening; 0 without bounds).
    std::vector<double> bound_rel_norm;
  };
  struct RunResult {
    EvalStatus status = EvalStatus::kCorrect;
    std::string message;
    double ms = 0;         // start to the end event on the stream
    double ms_device = 0;  // start to an event after a device-wide sync
    std::vector<OutputError> errors;
    std::vector<uint64_t> hashes;  // per output: a hash of its bits after this run
    std::vector<double> launch_ms;  // split runs: each launch on its own
  };

  // One candidate's evaluation on its way through EvaluateCompiled's phases:
  // what the phases share, and the result they build.
  struct Judgement {
    Judgement(const Candidate& c, const CompileResult& r);
    void Phase(const char* name);  // records the time since the last phase under `name`
    void KeepWorst(const std::vector<OutputError>& errors);

    const Candidate& candidate;
    const CompileResult& compiled;
    Evaluation e;
    std::chrono::steady_clock::time_point started, phase_mark;
    std::optional<ResolvedPlan> plan;
    std::vector<wire::Occupancy> occupancy;  // per launch, from the worker's load reply
    bool atomics = false;                    // then repeated runs may differ in their bits
    std::vector<std::vector<std::optional<uint64_t>>> first_bits;  // per set and output: the first run's hash
    std::map<std::string, OutputError> worst;  // per output, over every run
    std::vector<double> first_ms;              // the correctness runs
    double estimate_ms = 0;                    // one run, for the warm-up and the timed runs' count
    int run_index = 0;                         // runs after correctness (counted)
    int timing_set = 0;                        // the get_inputs() set of warm-up, timed and profiled runs (drawn)
    std::map<int, RunResult> shifted;          // the shifted sets' runs, made among the correctness runs
    std::vector<double> ms, ms_device;         // the timed runs
    std::string stopped = "runs";              // why the timed runs stopped (TimingStats::stopped)
    Roofline roofline;
    Robustness robustness;
  };
  // The phases, in EvaluateCompiled's order, each in the file of its concern.
  // A phase that ends the candidate's judgement (a failure) returns the result.
  std::optional<Evaluation> LoadCandidate(Judgement& j);     // plan, worker, module (gpu_evaluator_runs.cc)
  std::optional<Evaluation> CheckCorrectness(Judgement& j);  // every get_inputs() set (gpu_evaluator_verify.cc)
  std::optional<Evaluation> CheckRobustness(Judgement& j);   // shifted sets, other shapes (gpu_evaluator_robust.cc)
  std::optional<Evaluation> WarmUpPhase(Judgement& j);       // (gpu_evaluator_timing.cc)
  std::optional<Evaluation> TimedRuns(Judgement& j);         // (gpu_evaluator_timing.cc)
  std::optional<Evaluation> ProfilePhase(Judgement& j);      // per-launch figures (gpu_evaluator_timing.cc)
  std::optional<Evaluation> FinalChecks(Judgement& j);       // every input set (gpu_evaluator_verify.cc)
  void ChooseTiming(Judgement& j);                           // the reported series (gpu_evaluator_timing.cc)
  void ReportSpeed(Judgement& j);                            // speedups and roofline (gpu_evaluator_timing.cc)
  // What the phases share (gpu_evaluator.cc, but RunChecked: gpu_evaluator_verify.cc).
  // One run on `set`, its bits compared with the first run's on that set.
  RunResult RunChecked(Judgement& j, int set);
  // The result: every exit of EvaluateCompiled goes through here.
  Evaluation Conclude(Judgement& j, EvalStatus status, const std::string& message);
  // A failed run ends the judgement: the worst errors seen (or the run's own,
  // with own_errors, when it was incorrect), the module unloaded.
  Evaluation FailRun(Judgement& j, const RunResult& r, const std::string& message, bool own_errors);
  void TakeErrors(Judgement& j) const;  // the worst error of each output into j.e
  void UnloadCandidate();

  GpuEvaluator(const ReferenceData& ref, const GpuEvaluatorOptions& opts);
  Status Setup();
  // Setup's steps, in order.
  // The helper kernels (compiled, or from the cache: helper_cache.h) and the
  // hash key; the cubin's origin for the phase's name.
  StatusOr<HelperCubinOrigin> LoadHelpers();
  // The helper functions bound from `cubin` (helpers_ and the function handles).
  Status BindHelpers(const std::string& cubin);
  void SetupPhase(const std::string& name);  // setup_phases_: the time since the last one
  Status LayOutMemory();           // the arena's layout (Arena::LayOut) and the outputs' places in it
  Status FillMemory();             // the arena allocated and filled (Arena::Allocate, Fill)
  Status PlaceReferenceOutputs();  // each output's reference per set, and its RMS
  // A resident reference on another GPU than this one (one bridge serves every
  // GPU of `--gpus`; the PCI bus ids tell): own_copy_, so that no run reads across GPUs.
  void ChooseResidentCopy();
  Status LoadTensor(const std::string& path, CUdeviceptr dst, uint64_t bytes);
  // The bound array `key` (judge.h BoundKey) of set `set` on the host: `blocks` floats.
  StatusOr<std::vector<float>> ReadBound(int set, const std::string& key, int64_t blocks);
  // Each output's per-block bound for each set whose truth is float64 (Setup).
  Status LoadBounds();
  // Resident reference: tensor `name` of set `set` in the bridge's memory (mapped once per allocation).
  StatusOr<CUdeviceptr> ResidentTensorPtr(int set, const std::string& name, uint64_t bytes);
  // Copies tensor `name` of set `set` to dst: from its file, or from the resident bridge.
  Status FillTensor(int set, const std::string& name, CUdeviceptr dst, uint64_t bytes);
  Status StartWorker();  // worker_ started with WorkerInit()
  // What a worker is told at start: the arena, its outputs' poison, the helpers, the device.
  wire::InitRequest WorkerInit() const;
  // One candidate's counters run (gpu_evaluator_counters.cc).
  CounterReport CountersOf(const Candidate& candidate, const std::string& ncu);
  RunResult RunOnce(int set, bool split = false);
  // The checks after a run on `set` (outputs, inputs, guards), into r.
  void CheckRun(int set, RunResult& r);
  // Every input set and its padding against the pristine copy (restored when
  // changed): r becomes incorrect when a run wrote into any of them.
  void CheckEveryInputSet(RunResult& r);
  // `runs` warm-up runs on input set `set` in one worker request, then the
  // checks of the last run (outputs, the set's inputs, guards).
  RunResult WarmUp(int runs, int set, double estimate_ms);
  // A worker's reply to a run: true when it ran; otherwise r says why (a
  // timeout or a dead worker stops the worker).
  template <class Reply>
  bool ReplyOk(const WorkerReply<Reply>& reply, double limit, RunResult& r) {
    return ReplyOk(reply.received, reply.error, limit, r);
  }
  bool ReplyOk(const Status& received, const std::optional<wire::ErrorReply>& error, double limit, RunResult& r);
  // __device__ variables that changed (a worker's reply names them) make r incorrect.
  void NoteStateChanged(const std::vector<std::string>& changed, RunResult& r);
  // The worker's load request for a resolved plan (plan/worker_protocol.h).
  wire::LoadRequest BuildLoadRequest(const ResolvedPlan& plan, const CompileResult& compiled) const;
  // The per-launch figures (evaluator/profile/launch_profile.h) from a few split runs
  // after the timed ones; a run that fails here fails the candidate as any run does.
  StatusOr<std::vector<LaunchProfile>> ProfileLaunches(const ResolvedPlan& plan,
                                                       const std::vector<wire::Occupancy>& occupancy,
                                                       const Roofline& plan_roofline, int set,
                                                       const std::vector<double>& timed_ms, RunResult* failed);
  double RunTimeout() const;
  // The distribution-shifted sets (ReferenceSet::transform) of a candidate
  // correct on every get_inputs() set, each run by `run`: what held goes into
  // *robustness (gpu_evaluator_robust.cc). A run that crashes, hangs or fails
  // to launch there is returned: it fails the candidate as any run does.
  std::optional<RunResult> CheckShiftedSets(const std::function<RunResult(int)>& run, Robustness* robustness);
  // The problem's other shapes (ReferenceData::shape_variants), each judged by
  // an evaluator of its own (correctness only, its own worker) through the
  // same plan expressions: what held goes into *robustness.
  void CheckOtherShapes(const Candidate& candidate, const CompileResult& compiled, Robustness* robustness);
  // Starts the evaluators of the other shapes (Setup).
  Status SetupOtherShapes();
  // The tolerance of output `t` under opts_.precision (gpu_evaluator_robust.cc).
  Tolerance ContractTolerance(const TensorSpec& t) const;
  // Fills e's precision contract: what it is held to, the baselines and what its speedups are against.
  void NamePrecisionContract(Evaluation& e) const;
  // The tolerance of output o on input set `set`: ContractTolerance, its atol
  // scaled for a shifted set (ShiftedAtolScale), and at least as wide as that
  // set's own measured PyTorch rounding allows (InputTransform::reference_error).
  Tolerance SetTolerance(const OutputSlot& o, int set) const;
  // A shifted set's atol: the output's scale changed with its inputs, and an
  // absolute tolerance is relative to that scale (1 for a get_inputs() set).
  double ShiftedAtolScale(const OutputSlot& o, int set) const;
  Status CompareOutput(OutputSlot& o, int set, OutputError* err, bool* bad, uint64_t* hash);
  // Sum of squares of the finite values of a reference output (n elements).
  StatusOr<double> ReferenceSumSquares(const OutputSlot& o, int set);
  StatusOr<uint64_t> CountDiffWords(CUdeviceptr a, CUdeviceptr b, uint64_t bytes);
  // The keyed hash (gpu_internal::HashKey) of n elements of `width` bytes at p:
  // the same figure CompareOutput returns for an output's bits.
  StatusOr<uint64_t> HashRange(CUdeviceptr p, uint64_t n, size_t width);
  // One full wave of a helper kernel's 256-thread blocks: asked of the driver
  // once per helper at LoadHelpers (cmp_grid_, hash_grid_), not per launch.
  unsigned HelperGrid(CUfunction fn) const;
  StatusOr<uint64_t> CountNotFill(CUdeviceptr p, uint64_t bytes, uint8_t fill);
  Status MeasureBandwidth();

  ReferenceData ref_;
  GpuEvaluatorOptions opts_;
  Contract contract_ = Contract::kHighest;  // opts_.precision, parsed at Setup
  const CudaDriver* d_ = nullptr;
  PrimaryContext ctx_;
  DeviceInfo info_;
  std::string arch_;
  Module helpers_;  // comparison kernels and the timing pad, compiled at start
  std::string helpers_cubin_;  // sent to the worker, which launches the pad
  std::vector<std::pair<std::string, double>> setup_phases_;
  std::chrono::steady_clock::time_point setup_mark_;  // where the phase in progress began
  CUfunction cmp_fn_[9] = {};
  CUfunction diff_words_ = nullptr, count_not_fill_ = nullptr;
  CUfunction hash_fn_[4] = {};  // hash_b8 .. hash_b64
  unsigned cmp_grid_[9] = {}, hash_grid_[4] = {};  // HelperGrid of each, at LoadHelpers
  uint64_t hash_key_[2] = {};   // gpu_internal::HashKey, drawn at Setup
  // Per set and output, within one candidate's judgement: the hash and the
  // figures of a run verified against the reference. A later run of a kernel
  // without atomics must repeat it bit for bit, so its output is hashed
  // (one read) instead of compared again (two reads); a different hash falls
  // back to the full comparison. Cleared for each candidate.
  struct VerifiedOutput {
    uint64_t hash;
    OutputError error;
  };
  std::vector<std::vector<std::optional<VerifiedOutput>>> verified_;
  bool repeat_by_hash_ = false;  // the candidate has no atomics: verified_ may be used
  DeviceBuffer stats_;  // the helper kernels' results
  std::map<std::string, IpcMapping> resident_maps_;  // by IPC handle: the resident bridge's allocations
  // The resident reference lives on another GPU: its inputs and outputs are
  // copied into this GPU's pristine copy and reference buffers at Setup (one
  // peer copy) instead of being mapped, so staging, comparisons and pristine
  // reads never cross devices while another GPU times its runs (issue 33).
  bool own_copy_ = false;
  // The inputs the candidate sees, one set at a time, their pristine copies
  // and the guards (evaluator/arena.h); its checks call the helpers above.
  Arena arena_;
  std::vector<OutputSlot> outputs_;  // per output of the signature (places from arena_.outputs())
  std::string ipc_handle_;
  // The sandboxed worker (declared after the arena it maps: it ends first).
  WorkerClient worker_;
  double run_timeout_scale_ = 1;    // > 1 while a run is profiled (ncu replays each launch)
  std::string counters_unavailable_;  // why ncu cannot read counters here, once found
  bool ncu_extra_metrics_ = true;     // false once ncu refused one of NcuExtraMetrics()
  double bandwidth_gbps_ = 0;
  std::optional<StatusOr<DevicePeaks>> peaks_;  // measured (or failed) once
  double best_ms_ = 0;
  // Where one candidate's runs spend their time (Evaluation::run_parts): reset
  // by EvaluateCompiled, copied into the result by Conclude.
  struct RunParts {
    double stage = 0, worker = 0, kernel = 0, compare = 0, inputs = 0, guards = 0, final_inputs = 0;
    int runs = 0;
  };
  RunParts parts_;
  // Adds the seconds from its construction to its destruction to *into.
  class PartTimer {
   public:
    explicit PartTimer(double* into) : into_(into), start_(std::chrono::steady_clock::now()) {}
    ~PartTimer() { *into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
    PartTimer(const PartTimer&) = delete;
    PartTimer& operator=(const PartTimer&) = delete;

   private:
    double* into_;
    std::chrono::steady_clock::time_point start_;
  };
  // Set while EvaluatePractice or ReadPracticeCounters runs: the sets run
  // are the practice sets (CheckedSets), and the phases that belong to the
  // judge (shifted sets, other shapes, best_ms_) are skipped.
  bool practice_ = false;
  // The get_inputs() sets a candidate is checked on: the judging sets, or the practice sets.
  std::vector<int> CheckedSets() const;
  // An evaluator of another shape (SetupOtherShapes): correctness on its
  // get_inputs_variants() sets only, no shifted sets, no timing.
  bool correctness_only_ = false;
  std::vector<std::unique_ptr<GpuEvaluator>> shape_evaluators_;
};

}  // namespace ks
