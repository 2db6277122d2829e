// The one evaluator builder: every caller that judges kernels makes its
// evaluator here from an EvaluatorOptions, so the same flags give the same
// evaluator wherever they are read (`kernelsearch eval`, `search`, `suite`,
// `evaluate-pending`, the server's jobs and EvaluateKernel, `gpu-worker`).
//   ""  or "gpu"          the GPU evaluator (evaluator/gpu_evaluator.h) on the
//                          problem's cached reference; FailedPrecondition without a GPU
//   "fake" / "fake:FILE"   ScriptedEvaluator (scripted_evaluator.h), for tests
//
// Besides the evaluator, a search wants to know what the prompts should say
// about the GPU (search/prompts.h GpuFacts): evaluators that stand for a
// real device report it here, once, when they are made. The facts are fixed in
// the search's config when it is created (search_config.h), so that a split
// search renders the same prompts on a machine without the GPU.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/evaluator_api.h"
#include "evaluator/gpu_evaluator.h"
#include "evaluator/judge/judge.h"
#include "evaluator/problem.h"
#include "search/prompts.h"

namespace ks {

struct EvaluatorOptions {
  std::string spec;     // see above
  std::string python;   // interpreter for the reference bridge; "" = default
  int device = 0;       // CUDA device ordinal (when `gpus` is empty)
  // `--gpus`: "" = `device` only; "all" or "0,1,..": one evaluator per GPU
  // behind an EvaluatorPool (search/evaluator_pool.h). With a fake spec, one
  // scripted evaluator per listed ordinal ("all" = one).
  std::string gpus;
  // The precision contract a candidate is held to (evaluator/judge/judge.h),
  // parsed from its name where it enters: a flag, a search's config, a lease.
  Contract precision = Contract::kHighest;
  // The reference's base seed (ReferenceOptions::seed): the judging sets use
  // the default; the agent's practice sets (search/agent.h) use
  // kPracticeReferenceSeed, so that no practice set is a judging set.
  uint64_t reference_seed = 42;
  // GpuEvaluatorOptions::reveal_reference_values (off for practice evaluators).
  bool reveal_reference_values = true;
  // An agent's practice sets in the judging reference (ReferenceOptions::
  // practice_sets, from kPracticeReferenceSeed): the GPU evaluator then
  // serves the agent's tools too (SearchEvaluator::practice), in one GPU
  // memory budget with the judge. 0: none.
  int practice_sets = 0;

  // How the GPU evaluator judges and times (`kernelsearch eval`'s flags; a
  // search takes the defaults). Ignored by a scripted evaluator.
  int sets = 3;                // ReferenceOptions::sets: judging input sets
  std::string cache_dir;       // ReferenceOptions::cache_dir; "" = DefaultReferenceCacheDir()
  uint64_t cache_cap = 0;      // ReferenceOptions::cache_cap; 0 = DefaultCacheCap()
  bool drop_privileges = true; // GpuEvaluatorOptions::drop_privileges
  double run_timeout_s = 0;    // GpuEvaluatorOptions::run_timeout_s; 0 = auto
  TimingMode timing = TimingMode::kAdaptive;
  // Whether to fill SearchEvaluator::gpu from the GPU evaluator (measuring the
  // matmul peaks once per GPU): prompts need it; `eval` does not.
  bool describe_device = true;
  // ReferenceOptions::keep_s (`--keep-reference`): seconds a resident
  // reference stays on the GPU for the next command; 0 = not kept.
  double keep_reference_s = 0;
};

// The reference and GPU evaluator options `options` stand for on `gpus` GPUs
// (device_budget aside, which depends on the GPUs' free memory): what the
// builder hands to PrepareReference and GpuEvaluator::Create.
ReferenceOptions ReferenceOptionsFor(const EvaluatorOptions& options);
GpuEvaluatorOptions GpuEvaluatorOptionsFor(const EvaluatorOptions& options, int device, size_t gpus);

// What preparing the GPU evaluator's reference reported (ReferenceData), for
// callers that show it (`eval --verbose`); empty for a scripted evaluator.
struct ReferenceReport {
  bool from_cache = false;
  std::vector<std::pair<std::string, double>> phases;  // ReferenceData::phases
  std::vector<std::string> warnings, notes, evicted;
  Signature signature;
  double setup_s = 0;  // making the GPU evaluators once the reference was ready
  // With EvaluatorOptions::keep_reference_s and a resident reference: kept
  // for the next command, leased from an earlier one, or why not kept.
  std::optional<KeptInfo> kept;
  // The setup phases of the first GPU evaluator (GpuEvaluator::setup_phases).
  std::vector<std::pair<std::string, double>> setup_phases;
};

// Practice sets are drawn from seeds 1043, 1044, ... (set i uses seed + 1 + i)
// and judging sets from 43, 44, ...: disjoint for fewer than 1000 sets. The
// parameters (drawn from the base seed) differ too; a kernel takes them as
// inputs, so a correct one is correct for both.
inline constexpr uint64_t kPracticeReferenceSeed = 1042;

// The options of an agent's practice evaluator (search/agent.h) beside the
// judging one made with `judging`: practice input sets (kPracticeReferenceSeed),
// no reference values revealed, one GPU. A search's GPU side
// (SearchSetup::PrepareEvaluator) and a GPU worker serving the server's agents
// (server/gpu_worker.h) both make it so.
EvaluatorOptions PracticeEvaluatorOptions(EvaluatorOptions judging);

// An evaluator for one problem and what it knows about its device.
struct SearchEvaluator {
  std::unique_ptr<CandidateEvaluator> evaluator;
  // Set when the evaluator measured a real device (the GPU evaluator), or a
  // scripted one was told to pretend (its config's "gpu" object).
  std::optional<GpuFacts> gpu;
  // Why the reference cannot judge kernels (degenerate outputs), found where
  // it was computed: the GPU evaluator's reference, or the bridge's CPU check
  // for a scripted evaluator told to run it ("check_reference"). Empty: it can.
  std::vector<std::string> degenerate;
  // With EvaluatorOptions::practice_sets on the GPU evaluator: the agent's
  // practice evaluator (GpuEvaluator::PracticeView of the first GPU's), which
  // must be destroyed before `evaluator`. Null otherwise (a scripted
  // evaluator: the caller makes a practice evaluator of its own).
  std::unique_ptr<CandidateEvaluator> practice;
  // The GPU evaluators inside `evaluator`, one per GPU in the order of the
  // GPUs (borrowed; empty for a scripted evaluator): for their worker restarts
  // and peaks.
  std::vector<GpuEvaluator*> gpu_evaluators;
  ReferenceReport reference;
};

// The builder. The caller owns the evaluator; it is used for one problem.
// Several GPUs: one evaluator each, made at the same time, behind an
// EvaluatorPool; one GPU: its evaluator as it is.
StatusOr<SearchEvaluator> MakeSearchEvaluator(const std::string& problem_file, const EvaluatorOptions& options);
// The same, without the device facts (callers that only evaluate).
StatusOr<std::unique_ptr<CandidateEvaluator>> MakeEvaluator(const std::string& problem_file,
                                                            const EvaluatorOptions& options);

// The GPUs `options` asks for: {options.device} when `gpus` is empty, else
// ParseGpuList against this machine's device count (any ordinal for a fake spec).
StatusOr<std::vector<int>> ResolveGpus(const EvaluatorOptions& options);

// The number of CUDA devices; FailedPrecondition without a driver or GPU.
StatusOr<int> CudaDeviceCount();

// The facts prompts state about a device, from what the GPU evaluator queried
// and measured: GpuFactsFromDevice(ev->device_info(), ev->measured_bandwidth_gbps(),
// peaks). Figures not known (shared memory and registers per SM; FLOP peaks
// when `peaks` is null) stay 0, which the prompts render as unknown.
GpuFacts GpuFactsFromDevice(const DeviceInfo& info, double measured_bandwidth_gbps,
                            const DevicePeaks* peaks = nullptr);

}  // namespace ks
