#include "search/evaluator_factory.h"

#include "search/scripted_evaluator.h"

namespace ks {

GpuFacts GpuFactsFromDevice(const DeviceInfo& info, double measured_bandwidth_gbps) {
  GpuFacts g;
  g.name = info.name;
  g.compute_capability = std::to_string(info.sm_major) + "." + std::to_string(info.sm_minor);
  g.sm_count = info.multiprocessors;
  g.shared_bytes_per_block = info.shared_per_block_optin;
  g.l2_bytes = info.l2_bytes;
  g.memory_bandwidth_gbps = measured_bandwidth_gbps;
  return g;
}

// The GPU side is filled in when evaluator/gpu_evaluator.h lands (the lead's):
// it sets made.evaluator to the GpuEvaluator and made.gpu to
// GpuFactsFromDevice(its device_info(), its measured_bandwidth_gbps()). Until
// then a search that needs the GPU fails here, before any model call.
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
  if (spec.empty() || spec == "gpu")
    return FailedPrecondition("no GPU evaluator is available in this build (needed to evaluate " + problem_file +
                              "); use --generate-only here and `kernelsearch evaluate-pending` on a GPU node");
  return InvalidArgument("unknown evaluator '" + spec + "' (gpu, fake, fake:FILE)");
}

StatusOr<std::unique_ptr<CandidateEvaluator>> MakeEvaluator(const std::string& problem_file,
                                                            const EvaluatorOptions& options) {
  KS_ASSIGN_OR_RETURN(SearchEvaluator made, MakeSearchEvaluator(problem_file, options));
  return std::move(made.evaluator);
}

}  // namespace ks
