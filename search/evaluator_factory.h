// Choosing the evaluator a search runs its candidates through.
//   ""  or "gpu"          the GPU evaluator (evaluator/gpu_evaluator.h), on the
//                          problem file; FailedPrecondition while none is built in
//   "fake" / "fake:FILE"   ScriptedEvaluator (scripted_evaluator.h), for tests
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "evaluator/evaluator_api.h"

namespace ks {

struct EvaluatorOptions {
  std::string spec;     // see above
  std::string python;   // interpreter for the reference bridge; "" = default
  int device = 0;       // CUDA device ordinal
};

// The caller owns the evaluator; it is used for one problem.
StatusOr<std::unique_ptr<CandidateEvaluator>> MakeEvaluator(const std::string& problem_file,
                                                            const EvaluatorOptions& options);

}  // namespace ks
