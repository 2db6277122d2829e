// `kernelsearch export`: a stored candidate as files a user can take away — the
// CUDA source, its launch plan, the problem, and a Python module whose ModelNew
// is a drop-in replacement for the problem's Model in PyTorch.
//
// The module must run the kernel exactly as the evaluator ran it when it was
// judged correct, so at export time the candidate is compiled (NVRTC in
// ks-worker, no GPU needed) to learn each kernel's parameter kinds from its PTX,
// and its plan is resolved against the problem's signature with the evaluator's
// own ResolvePlan. The module embeds both: the kinds, to pass each argument as
// the evaluator does (int32 vs int64, float vs double), and the resolved plan,
// which it checks its own resolution against at the signature's shapes. At run
// time it compiles with the evaluator's NVRTC options and prelude header, and
// evaluates plan expressions against each call's tensor shapes with the
// evaluator's rules (ks_launch_plan.py, a Python mirror of
// evaluator/plan/launch_plan.cc; tests compare the two).
//
// The Python is real files, export/kernel_module.py (a template) and
// export/ks_launch_plan.py (copied as it is), installed as data in
// share/kernelsearch/export/ and found with FindDataFile, like the reference
// bridge; tests/export/ tests them with pytest.
//
// Pure functions of the store's contents; thread-safe as the store is.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evaluator/plan/kernel_info.h"
#include "evaluator/plan/launch_plan.h"
#include "store/lineage_store.h"

namespace ks {

struct ExportOptions {
  // The target to compile for when the candidate's evaluation recorded none
  // (older records): any NVRTC accepts for the source, since parameter kinds
  // do not depend on it. A recorded target wins. An exported module compiles
  // for the GPU it runs on, except that an arch-specific target (sm_90a) is
  // kept and a GPU of another architecture is refused.
  std::string arch = "sm_90a";
  std::string worker_path;  // ks-worker; "" = FindWorker
  std::string cuda_home;    // "" = FindCudaHome
  // A specialised kernel (correct on get_inputs() only; a distribution-shifted
  // input set broke it) is refused unless this is set: a user would otherwise
  // put a kernel into a model whose inputs it may get wrong, unwarned.
  bool allow_specialised = false;
};

struct ExportedFile {
  std::string name;  // relative to the output folder
  std::string text;
};

// kernel.cu, plan.json, problem.py, ks_launch_plan.py and kernel_module.py for
// candidate `candidate_id`. FailedPrecondition when the store has no signature
// for the problem, or the candidate does not compile or its plan does not
// resolve (there is nothing correct to export).
StatusOr<std::vector<ExportedFile>> ExportCandidate(store::LineageStore* store, int64_t candidate_id,
                                                    const ExportOptions& options);

// ---- pieces, exposed for tests ----

// The NVRTC options the evaluator compiles with (evaluator/compile/nvrtc_compile.cc),
// between -arch=... and the -I include folders, and its pre-included header.
const std::vector<std::string>& EvaluatorNvrtcOptions();
const char* EvaluatorNvrtcPrelude();

// "b64", "b32", "f32", "f64", "b16", "b8", "bytes".
const char* ParamKindCode(ParamKind k);
// {"kernel name": ["b64", "b32", ...]} for ks_launch_plan.py.
nlohmann::json KernelParamKindsJson(const std::vector<KernelInfo>& kernels);
// A resolved plan in the form ks_launch_plan.resolve_plan returns:
// {"launches": [{"kernel", "grid": [3], "block": [3], "shared", "cluster": [3] | null,
//   "args": [{"kind": "tensor"|"scratch", "name"} | {"kind": "i32"|"i64"|"f32"|"f64", "value"}]}],
//  "scratch": [{"name", "bytes"}]}
nlohmann::json ResolvedPlanToJson(const ResolvedPlan& plan);

// The text of export/ks_launch_plan.py (no torch needed to import it).
StatusOr<std::string> LaunchPlanPython();

// Fills export/kernel_module.py's placeholders with `values`, in one pass (a
// value may hold "@@"): "@@NAME@@" in double quotes becomes a Python string
// literal holding the value (so the template stays valid Python); a bare
// @@NAME@@, in the docstring, the value with quotes, backslashes and newlines
// blanked. Internal when a placeholder has no value.
StatusOr<std::string> RenderModuleTemplate(const std::string& text, const std::map<std::string, std::string>& values);

}  // namespace ks
