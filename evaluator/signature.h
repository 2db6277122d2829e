// The problem signature (DESIGN.md, contract 1) as the reference bridge reports
// it, and the reference data layout it writes. Plain data; JSON round trip.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ks {

enum class DType { kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kInt8, kUInt8, kBool };

StatusOr<DType> ParseDType(const std::string& s);  // "float32", "bfloat16", ...
const char* DTypeName(DType d);
size_t DTypeSize(DType d);
bool IsFloating(DType d);

// One named value of the signature: a tensor (shape, contiguous strides) or a
// plain scalar argument of forward (int or float, with its value).
struct TensorSpec {
  std::string name;   // forward parameter name, state_dict key, or out / out0..
  bool is_scalar = false;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;    // tensors only
  std::vector<int64_t> strides;  // elements, contiguous
  double scalar_value = 0;       // scalars only (same in every input set)

  int64_t numel() const;
  int64_t bytes() const { return numel() * static_cast<int64_t>(DTypeSize(dtype)); }
};

// How close a candidate's output must be to the reference (DESIGN.md,
// "Evaluator rules"). Every test must hold:
//  - element-wise: |out - ref| <= atol + rtol * |ref| (allclose);
//  - relative norm: ||out - ref|| / ||ref|| <= rel_norm. Stops outputs smaller
//    than atol from being garbage (a half-precision softmax passes allclose
//    with 100% relative error on its small elements, not this);
//  - large errors: among the elements that are not tiny (|ref| at least
//    TinyFraction() of the output's RMS), the share with a relative error
//    above large_rel is at most large_share. Stops "skip the work where the
//    output is small".
// rel_norm, large_rel and large_share are 0 where they do not apply (integer
// and bool outputs compare exactly). In a problem's TOLERANCE, a field left
// out (0 here) takes the rule in Signature::ToleranceFor.
struct Tolerance {
  double atol = 0;
  double rtol = 0;
  double rel_norm = 0;
  double large_rel = 0;
  double large_share = 0;

  // "Tiny" elements are below this fraction of the output's RMS: 1%, or
  // more where the norm bound allows errors that would be large relative to
  // such elements (an honest bf16 kernel's errors are ~0.5% of the RMS).
  double TinyFraction() const { return large_rel > 0 ? std::max(0.01, 2 * rel_norm / large_rel) : 0; }
};

// The defaults for an output of dtype d, before a problem's TOLERANCE.
Tolerance DefaultTolerance(DType d);

// PyTorch's own rounding error in one float32 output: the reference against
// the same model and inputs run in float64 (input set 0; bridge.py
// measure_rounding). A long sum with heavy cancellation has a large one, and
// two honest summation orders differ by about as much.
struct ReferenceError {
  double rms = 0;       // RMS of ref32 - ref64
  double rel_norm = 0;  // ||ref32 - ref64|| / ||ref64||
};

// A float32 output's tolerance widened by its ReferenceError: a candidate may
// be at most kRoundingFactor times as inaccurate as PyTorch's own float32.
// Above kMaxRoundingRelNorm the float64 run is not measuring rounding (a
// data-dependent branch; a problem that needs a TOLERANCE of its own), and
// nothing is widened. The same constants as the bridge's (reference/ks_bridge/rounding.py).
inline constexpr double kRoundingFactor = 16;
inline constexpr double kMaxRoundingRelNorm = 1e-3;
//   atol      += kRoundingFactor * rms
//   rel_norm   = max(rel_norm, kRoundingFactor * rel_norm_err)
//   large_rel  = max(large_rel, 20 * kRoundingFactor * rel_norm_err)
// (large_rel stays 20 times the norm bound, as for fp16 and bf16, so that
// "tiny" stays at most 10% of the RMS.) A lower precision stays out: fp16
// arithmetic rounds 8192 times coarser than fp32, bf16 65536 times.
Tolerance WidenForRounding(Tolerance t, const ReferenceError& e);

// The tolerance on a distribution-shifted input set (issue 27): `set0` (the
// output's tolerance on the get_inputs() sets, widened by set 0's rounding)
// with its atol times `scale` (the output's RMS on this set over set 0's: an
// absolute tolerance follows the output's scale), and at least as wide as the
// dtype's `base` widened by this set's own measured rounding `own` (at this
// set's scale already), where measured: a shifted set rounds otherwise
// (outliers dominate a variance; a scaled sum cancels differently).
Tolerance ShiftedSetTolerance(Tolerance set0, Tolerance base, double scale, const ReferenceError* own);

// What the GPU evaluator's comparison (Compare in gpu_evaluator_internal.h)
// finds for `out` against `ref` under `tol`, computed on the host: for
// checking tolerance rules without a GPU. Elements are compared as doubles;
// NaN and Inf must match the reference's.
struct HostComparison {
  int64_t mismatches = 0;    // outside atol + rtol * |ref|
  double rel_norm = 0;       // ||out - ref|| / ||ref|| over finite elements
  int64_t considered = 0;    // not tiny
  int64_t large_errors = 0;  // of those, relative error above large_rel
  bool passes = false;       // every rule of Tolerance holds
};
HostComparison CompareOnHost(const Tolerance& tol, const std::vector<double>& out, const std::vector<double>& ref);

struct Signature {
  std::string file;         // the problem file as given
  std::string name;         // file stem
  std::string description;  // DESCRIPTION, or ""
  std::optional<Tolerance> tolerance;  // TOLERANCE, when the problem sets it
  // Useful work per call, for the compute floor: the problem's FLOPS, else
  // counted by the bridge (torch.utils.flop_counter on the meta device:
  // matmul, convolution, attention); absent when neither (flops_note says why).
  std::optional<double> flops;
  std::string flops_source;                       // "FLOPS", "counted", "" (absent)
  std::map<std::string, double> flops_by_class;   // compute class ("fp32", "bf16", ...) -> FLOPs
  std::string flops_note;                         // why not counted, or what the count leaves out
  std::vector<TensorSpec> inputs;      // forward's arguments, in order
  std::vector<TensorSpec> parameters;  // state_dict entries
  std::vector<TensorSpec> outputs;     // out, or out0, out1, ...
  // PyTorch's own float32 rounding by output name, where the reference
  // measured it (absent: not measured, the tolerance is not widened).
  std::map<std::string, ReferenceError> reference_error;

  // Inputs, then parameters, then outputs.
  const TensorSpec* Find(const std::string& name) const;
  // Bytes that must move: every input and parameter read once, every output written once.
  int64_t MinimumBytes() const;
  // The tolerance to apply to an output: the dtype's defaults, with the
  // problem's TOLERANCE over them (see signature.cc for how a looser rtol
  // loosens the norm bounds).
  Tolerance ToleranceFor(DType output_dtype) const;
  // The tolerance of one output: ToleranceFor(dtype), widened by its measured
  // ReferenceError (float32 outputs, see WidenForRounding).
  Tolerance ToleranceFor(const TensorSpec& output) const;
  // That tolerance in words, for messages: "atol 0.0589 (1e-4 + 16 x PyTorch's
  // own float32 error, RMS 0.00368), rtol 1e-4".
  std::string DescribeTolerance(const TensorSpec& output) const;
};

StatusOr<Signature> SignatureFromJson(const nlohmann::json& j);
nlohmann::json SignatureToJson(const Signature& s);

}  // namespace ks
