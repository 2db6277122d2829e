// The floor a candidate is judged against (DESIGN.md: "the roofline fraction
// against the larger of the memory floor and the compute floor"): the bytes
// that must move over the measured copy bandwidth, and the problem's FLOPs
// (declared or counted, Signature::flops) over the measured matmul peak of
// their compute class. Pure functions of figures: no GPU, safe to test on a CPU.
#pragma once

#include <string>

#include "evaluator/judge/judge.h"
#include "evaluator/evaluation.h"
#include "evaluator/problem.h"
#include "evaluator/signature.h"

namespace ks {

// The fastest float32-accurate matmul path of a GPU: the fp32 peak (FFMA,
// TF32 off), or 3xTF32 on the tensor cores (each operand split into a TF32
// high and low part, three TF32 products: float32 accuracy at a third of the
// TF32 rate) where that is faster. An honest fp32 kernel that uses 3xTF32
// must not show more than 100% of its floor, so the floor takes the faster.
// The floor follows the precision contract (issue 36; evaluator/judge/judge.h):
// the fastest method the contract admits for fp32 work on this GPU.
//  - highest: fp32 FFMA, 3xTF32, or a scaled 3xFP16 split (each operand
//    split into fp16 high and low parts with an exact power-of-two scale per
//    row and K chunk: fp32 accuracy at a third of the FP16 rate; a robust
//    kernel found by the search ran at 143% of a 3xTF32 floor this way);
//  - high: 1xTF32 as well; medium: 1xBF16 as well; kernelbench: 1xFP16 too
//    (atol = rtol = 1e-2 admits half precision).
// A kernel above 100% of its floor is a bug in the floor.
struct Fp32Path {
  double tflops = 0;    // the peak the floor uses; 0 when none was measured
  std::string name;     // "fp32", "3xTF32", "3xFP16", "TF32", "BF16" or "FP16"
};
Fp32Path FastestFp32Path(const DevicePeaks& peaks, Contract contract = Contract::kHighest);

// The peak a compute class is bounded by: fp32 -> FastestFp32Path, the others
// their own measured peak; 0 when not measured (fp64, int8).
double ClassPeakTflops(const DevicePeaks& peaks, const std::string& compute_class,
                       Contract contract = Contract::kHighest);

// The floor of a plan before it is timed: bytes, FLOPs, both floors, the
// bound, the peaks used. `peaks` may be null (not measured: no compute floor);
// `override_tflops` > 0 replaces every class's peak (--peak-tflops).
// FLOPs without a per-class split (a FLOPS figure) take ComputeClassFor.
Roofline PlanRoofline(const Signature& sig, double peak_gbps, const DevicePeaks* peaks, double override_tflops,
                      Contract contract = Contract::kHighest);

// The achieved figures and the fraction of the floor for a median time.
void FinishRoofline(double median_ms, Roofline* rf);

// "compute floor 1.23 ms: 137 GFLOP counted (fp32) at 165 TFLOP/s, 3xTF32 ..."
// One or two lines naming the bound and every peak used (eval, show, report).
std::string RooflineFloorText(const Roofline& rf);

}  // namespace ks
