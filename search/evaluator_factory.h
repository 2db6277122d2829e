// Choosing the evaluator a search runs its candidates through.
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

#include "common/status.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/evaluator_api.h"
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
  // The precision contract a candidate is held to: "fp32" or "tf32" (GpuEvaluatorOptions::precision).
  std::string precision = "highest";
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
};

// Practice sets are drawn from seeds 1043, 1044, ... (set i uses seed + 1 + i)
// and judging sets from 43, 44, ...: disjoint for fewer than 1000 sets. The
// parameters (drawn from the base seed) differ too; a kernel takes them as
// inputs, so a correct one is correct for both.
inline constexpr uint64_t kPracticeReferenceSeed = 1042;

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
};

// The caller owns the evaluator; it is used for one problem.
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
