// Robustness beyond get_inputs() (issue 27): a candidate correct on every
// get_inputs() set is run once more on each distribution-shifted set the
// bridge made (evaluator/reference/transforms.py: inputs scaled by large and
// small powers of ten, negated, with outliers). Stops a kernel specialised to
// the benchmark's input distribution (fp32 split into fp16 halves, exact for
// values in [0, 1) only; an exp without the max subtracted) from passing
// unmarked: it stays correct, marked specialised with the first transform
// that broke it, and the search and `export` act on the mark.
#include <algorithm>
#include <cmath>

#include "evaluator/gpu_evaluator.h"
#include "evaluator/gpu_evaluator_internal.h"

namespace ks {

double GpuEvaluator::ShiftedAtolScale(const OutputSlot& o, int set) const {
  if (set <= 0 || set >= static_cast<int>(ref_.sets.size()) || ref_.sets[set].transform.empty()) return 1;
  // Each shifted set is input set 0 transformed: its outputs' scale against set 0's.
  const double base = o.ref_rms.empty() ? 0 : o.ref_rms[0], here = o.ref_rms[set];
  if (!(base > 0) || !(here > 0) || !std::isfinite(base) || !std::isfinite(here)) return 1;
  return here / base;
}

std::optional<GpuEvaluator::RunResult> GpuEvaluator::CheckShiftedSets(const std::function<RunResult(int)>& run,
                                                                      Robustness* robustness) {
  const int judging = ref_.JudgingSets();
  robustness->checks.push_back({"get_inputs", "held", std::to_string(judging) + " input set(s) from get_inputs()"});
  if (contract_ == Contract::kKernelBench) {
    robustness->checks.push_back({"transforms", "not_checked",
                                  "the kernelbench contract judges the get_inputs() sets only, as KernelBench does"});
    return std::nullopt;
  }
  if (ref_.transforms.empty())
    robustness->checks.push_back({"transforms", "not_checked",
                                  "the reference has no distribution-shifted input sets (made before they existed)"});
  for (const InputTransform& t : ref_.transforms) {
    if (t.set < judging || t.set >= static_cast<int>(ref_.sets.size())) {
      robustness->checks.push_back({t.name, "not_checked", t.note});
      continue;
    }
    RunResult r = run(t.set);
    if (r.status == EvalStatus::kCorrect) {
      robustness->checks.push_back({t.name, "held", t.note});
    } else if (r.status == EvalStatus::kIncorrect) {
      robustness->checks.push_back({t.name, "broke", t.note + ": " + r.message});
      if (robustness->broken_by.empty()) robustness->broken_by = t.name;
    } else {
      r.message = "input set " + std::to_string(t.set) + " (" + t.note + "): " + r.message;
      return r;
    }
  }
  return std::nullopt;
}

Tolerance GpuEvaluator::SetTolerance(const OutputSlot& o, int set) const {
  const double scale = ShiftedAtolScale(o, set);
  const ReferenceSet& rs = ref_.sets[set];
  if (rs.truth == "float64" && set < static_cast<int>(o.bounds.size()) && o.bounds[set].get()) {
    // Against the float64 truth: the judge's rule (evaluator/judge/judge.h);
    // PyTorch's own error on this set is in the per-block bound.
    auto it = rs.pytorch_error.find(o.spec->name);
    Tolerance t = ToleranceFor(ref_.signature, *o.spec, it == rs.pytorch_error.end() ? nullptr : &it->second,
                               contract_);
    t.atol *= scale;
    // The norm an output would have with every element at its block's bound.
    if (t.rel_norm > 0 && set < static_cast<int>(o.bound_rel_norm.size()))
      t.rel_norm = std::max(t.rel_norm, o.bound_rel_norm[set]);
    return t;
  }
  if (contract_ == Contract::kKernelBench) return ToleranceFor(ref_.signature, *o.spec, nullptr, contract_);
  // PyTorch's float32 output as the reference (the float64 run was skipped):
  // the rule before issue 36, widened by measured rounding.
  const ReferenceError* own = nullptr;  // this shifted set's own rounding (float32 outputs, where measured)
  if (o.spec->dtype == DType::kFloat32)
    for (const InputTransform& t : ref_.transforms)
      if (t.set == set && set > 0) {
        auto it = t.reference_error.find(o.spec->name);
        if (it != t.reference_error.end()) own = &it->second;
      }
  return ShiftedSetTolerance(ContractTolerance(*o.spec), ref_.signature.ToleranceFor(o.spec->dtype), scale, own);
}

Status GpuEvaluator::SetupOtherShapes() {
  for (const ReferenceData& variant : ref_.shape_variants) {
    GpuEvaluatorOptions vo = opts_;
    vo.measure_peaks = false;
    vo.run_timeout_s = RunTimeout();  // the variant is untimed: the main shape's limit
    std::unique_ptr<GpuEvaluator> e(new GpuEvaluator(variant, vo));
    e->correctness_only_ = true;
    KS_RETURN_IF_ERROR(e->Setup().WithContext("the evaluator of the problem's shape " + ShapeVariantName(variant)));
    shape_evaluators_.push_back(std::move(e));
  }
  return Status::Ok();
}

void GpuEvaluator::CheckOtherShapes(const Candidate& candidate, const CompileResult& compiled,
                                    Robustness* robustness) {
  if (shape_evaluators_.empty()) {
    // KernelBench's format has one shape per problem: say so rather than imply more was checked.
    robustness->checks.push_back({"shapes", "not_checked",
                                  "the problem declares one shape (get_inputs(); no get_inputs_variants()): "
                                  "shapes were not varied"});
    return;
  }
  for (auto& ev : shape_evaluators_) {
    const std::string at = ShapeVariantName(ev->ref_);
    Evaluation v = ev->EvaluateCompiled(candidate, compiled);
    if (v.correct()) {
      robustness->checks.push_back({"shapes", "held", at});
      continue;
    }
    // A kernel with sizes written into it, or a plan that only fits get_inputs()'s shapes.
    robustness->checks.push_back({"shapes", "broke", at + ": " + EvalStatusName(v.status) + ": " + v.message});
    if (robustness->broken_by.empty()) robustness->broken_by = "shapes";
  }
}

// How much less accurate than PyTorch's default precision a "tf32" candidate
// may be: twice its error, as an honest 1xTF32 kernel's summation order differs
// from cuDNN's by about as much again.
constexpr double kTf32Factor = 2;

Tolerance GpuEvaluator::ContractTolerance(const TensorSpec& t) const {
  Tolerance tol = ref_.signature.ToleranceFor(t);
  if (contract_ != Contract::kHigh || t.dtype != DType::kFloat32) return tol;
  auto it = ref_.default_precision_error.find(t.name);
  if (it == ref_.default_precision_error.end()) return tol;
  const ReferenceData::PrecisionError& d = it->second;
  tol.atol += kTf32Factor * d.max_abs;
  tol.rel_norm = std::max(tol.rel_norm, kTf32Factor * d.rel_norm);
  // As a problem's looser rtol loosens the large-error threshold (signature.h).
  if (tol.large_rel > 0) tol.large_rel = std::max(tol.large_rel, 10 * tol.rel_norm);
  return tol;
}

void GpuEvaluator::NamePrecisionContract(Evaluation& e) const {
  const bool differs = !ref_.default_precision_error.empty();
  e.precision = ContractName(contract_);
  int float64_sets = 0;
  for (const auto& s : ref_.sets) float64_sets += s.truth == "float64";
  e.baseline = float64_sets == static_cast<int>(ref_.sets.size())
                   ? "judged against the model run in float64 on every input set"
                   : float64_sets > 0 ? "judged against float64 on " + std::to_string(float64_sets) + " of " +
                                            std::to_string(ref_.sets.size()) + " input sets (PyTorch's float32 output "
                                            "on the others: the float64 run was skipped there)"
                                      : "judged against PyTorch's float32 output (the float64 run was skipped)";
  if (contract_ == Contract::kKernelBench)
    e.baseline += "; KernelBench's rule (atol = rtol = 1e-2); speedup_best is against the faster of eager and "
                  "torch.compile";
  if (ref_.timing_precision == "high" || ref_.timing_precision == "medium")
    e.baseline += "; eager and torch.compile timed under torch.set_float32_matmul_precision(\"" +
                  ref_.timing_precision + "\") with cuDNN TF32 on";
  if (!differs) {
    e.baseline += "; PyTorch's defaults compute in full fp32 here as the reference does";
    return;
  }
  e.baseline += "; PyTorch's defaults compute this problem's convolutions in TF32 (torch.backends.cudnn.allow_tf32); "
                "eager_fp32 is eager with TF32 off";
  e.eager_fp32 = ref_.eager_fp32;
  if (ref_.eager_fp32 && e.timing && e.timing->median_ms > 0)
    e.speedup_eager_fp32 = ref_.eager_fp32->median_ms / e.timing->median_ms;
}

// Phase 3 (a candidate correct on every get_inputs() set): the shifted sets,
// then the problem's other shapes. A run that crashes, hangs or fails to
// launch on a shifted set fails the candidate; anything else only marks it.
std::optional<Evaluation> GpuEvaluator::CheckRobustness(Judgement& j) {
  if (practice_) {  // the shifted sets and other shapes are the judge's, never practised on
    j.robustness.checks.push_back({"get_inputs", "held", std::to_string(CheckedSets().size()) + " practice set(s)"});
    j.robustness.checks.push_back({"shifted", "not_checked", "practice: the distribution-shifted sets are the judge's"});
    return std::nullopt;
  }
  // The shifted sets ran among the get_inputs() sets (CheckCorrectness); a
  // set not run there (a crash ended that phase first) never counts as held.
  const RunResult* crashed = nullptr;
  for (const auto& [set, r] : j.shifted)
    if (r.status != EvalStatus::kCorrect && r.status != EvalStatus::kIncorrect) crashed = &r;
  auto run = [&](int set) {
    auto it = j.shifted.find(set);
    if (it != j.shifted.end()) return it->second;
    return *crashed;  // not run: the phase ended at the crash, which is what fails the candidate
  };
  if (auto failed = CheckShiftedSets(run, &j.robustness))
    return FailRun(j, *failed, failed->message, /*own_errors=*/false);
  j.Phase("shifted_inputs");
  CheckOtherShapes(j.candidate, j.compiled, &j.robustness);
  j.Phase("other_shapes");
  return std::nullopt;
}

}  // namespace ks
