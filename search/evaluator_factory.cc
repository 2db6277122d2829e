#include "search/evaluator_factory.h"

#include <algorithm>

#include "evaluator/cuda_driver.h"
#include "evaluator/gpu_evaluator.h"
#include "evaluator/problem.h"
#include "search/scripted_evaluator.h"

namespace ks {

GpuFacts GpuFactsFromDevice(const DeviceInfo& info, double measured_bandwidth_gbps, const DevicePeaks* peaks) {
  GpuFacts g;
  g.name = info.name;
  g.compute_capability = std::to_string(info.sm_major) + "." + std::to_string(info.sm_minor);
  g.sm_count = info.multiprocessors;
  g.shared_bytes_per_block = info.shared_per_block_optin;
  g.l2_bytes = info.l2_bytes;
  g.shared_bytes_per_sm = info.shared_per_sm;
  g.registers_per_sm = info.registers_per_sm;
  g.max_threads_per_sm = info.max_threads_per_sm;
  g.max_blocks_per_sm = info.max_blocks_per_sm;
  // No driver attribute says it; 255 holds for every GPU the evaluator runs on (sm_50 and later).
  if (info.sm_major >= 5) g.max_registers_per_thread = 255;
  g.memory_bandwidth_gbps = measured_bandwidth_gbps;
  if (peaks) {
    g.fp32_tflops = peaks->For("fp32");
    g.tf32_tflops = peaks->For("tf32");
    g.fp16_tensor_tflops = std::max(peaks->For("fp16"), peaks->For("bf16"));
  }
  return g;
}

StatusOr<SearchEvaluator> MakeSearchEvaluator(const std::string& problem_file, const EvaluatorOptions& options) {
  const std::string& spec = options.spec;
  SearchEvaluator made;
  if (spec == "fake") {
    made.evaluator = std::make_unique<ScriptedEvaluator>(ScriptedEvaluatorOptions{});
    return made;
  }
  if (spec.rfind("fake:", 0) == 0) {
    KS_ASSIGN_OR_RETURN(ScriptedEvaluatorOptions o, LoadScriptedEvaluatorOptions(spec.substr(5)));
    made.gpu = o.gpu;
    made.evaluator = std::make_unique<ScriptedEvaluator>(std::move(o));
    return made;
  }
  if (spec.empty() || spec == "gpu") {
    // Checked before the reference is computed, so a CPU-only node says so at once.
    std::string why;
    if (!GpuAvailable(&why))
      return FailedPrecondition("evaluating " + problem_file + " needs a GPU (" + why +
                                "); use --generate-only here and `kernelsearch evaluate-pending` on a GPU node");
    ReferenceOptions ro;
    ro.bridge.python = options.python;
    ro.device = "cuda";
    ro.time = true;
    // Sets beyond what the GPU holds are not prepared (at least 2; a warning says so).
    if (auto free_mem = FreeDeviceMemory(options.device); free_mem.ok()) ro.device_budget = *free_mem / 10 * 9;
    KS_ASSIGN_OR_RETURN(ReferenceData ref, PrepareReference(problem_file, ro));
    GpuEvaluatorOptions go;
    go.device = options.device;
    go.python = options.python;
    KS_ASSIGN_OR_RETURN(std::unique_ptr<GpuEvaluator> ev, GpuEvaluator::Create(ref, go));
    // Peaks are measured once per GPU and cached; a failure only leaves them unknown in prompts.
    auto peaks = ev->Peaks();
    made.gpu = GpuFactsFromDevice(ev->device_info(), ev->measured_bandwidth_gbps(), peaks.ok() ? &*peaks : nullptr);
    made.evaluator = std::move(ev);
    return made;
  }
  return InvalidArgument("unknown evaluator '" + spec + "' (gpu, fake, fake:FILE)");
}

StatusOr<std::unique_ptr<CandidateEvaluator>> MakeEvaluator(const std::string& problem_file,
                                                            const EvaluatorOptions& options) {
  KS_ASSIGN_OR_RETURN(SearchEvaluator made, MakeSearchEvaluator(problem_file, options));
  return std::move(made.evaluator);
}

}  // namespace ks
