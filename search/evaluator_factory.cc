#include "search/evaluator_factory.h"

#include "search/scripted_evaluator.h"

namespace ks {

// The GPU side is filled in when evaluator/gpu_evaluator.h lands (the lead's);
// until then a search that needs the GPU fails here, before any model call.
StatusOr<std::unique_ptr<CandidateEvaluator>> MakeEvaluator(const std::string& problem_file,
                                                            const EvaluatorOptions& options) {
  const std::string& spec = options.spec;
  if (spec == "fake") return std::unique_ptr<CandidateEvaluator>(new ScriptedEvaluator({}));
  if (spec.rfind("fake:", 0) == 0) {
    KS_ASSIGN_OR_RETURN(ScriptedEvaluatorOptions o, LoadScriptedEvaluatorOptions(spec.substr(5)));
    return std::unique_ptr<CandidateEvaluator>(new ScriptedEvaluator(std::move(o)));
  }
  if (spec.empty() || spec == "gpu")
    return FailedPrecondition("no GPU evaluator is available in this build (needed to evaluate " + problem_file +
                              "); use --generate-only here and `kernelsearch evaluate-pending` on a GPU node");
  return InvalidArgument("unknown evaluator '" + spec + "' (gpu, fake, fake:FILE)");
}

}  // namespace ks
