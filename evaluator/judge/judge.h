// The judging rule in one place (issue 36): the precision contracts a user
// names (PyTorch's own names), their constants, and the tolerance of one
// output on one input set under one contract. Read by the GPU evaluator
// (gpu_evaluator_verify.cc, gpu_evaluator_robust.cc), export's check() (the
// contract's numbers travel in the exported module), the prompts' text, and
// the bridge's Python: evaluator/reference/ks_bridge/judge.py holds the same
// constants, and judge_test keeps the two in step.
//
// What "right" means: the float64 truth. For every input set the bridge runs
// the model in float64 as well; a candidate is compared with that result,
// element by element, within the dtype's atol/rtol plus, per block of
// kBoundBlock elements, the contract's factor times PyTorch's own error
// there (|PyTorch - float64|, the largest in the block). "As accurate as
// PyTorch" keeps its meaning; an exact kernel always passes, and a set on
// which PyTorch's float32 output is itself far from float64 (ill-conditioned)
// is judged with the bound PyTorch needs there and named, never held
// against a kernel. Where the float64 run was not made (over its time or
// memory budget), the set is judged against PyTorch's float32 output as
// before (Signature::ToleranceFor), and its note says so.
//
// Plain functions and constants; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/signature.h"

namespace ks {

enum class Contract {
  kHighest,      // torch.set_float32_matmul_precision("highest"): full fp32
  kHigh,         // "high": TF32-class matmul and convolution error allowed
  kMedium,       // "medium": bf16-class
  kKernelBench,  // KernelBench's own rule: atol = rtol = 1e-2 on the get_inputs() sets
};

// "highest", "high", "medium", "kernelbench"; the aliases "fp32" (highest)
// and "tf32" (high) of earlier versions are accepted. InvalidArgument otherwise.
StatusOr<Contract> ParseContract(const std::string& name);
const char* ContractName(Contract c);
// Every name ParseContract accepts, aliases last (for --help and validation).
std::vector<std::string> ContractNames();
// A stored or typed name in its canonical form ("fp32" -> "highest"); an
// unknown name is returned as it is.
std::string CanonicalContract(const std::string& name);

// Elements per block of the bound arrays (ks_bridge/judge.py BOUND_BLOCK).
inline constexpr int kBoundBlock = 256;
// How many times PyTorch's own error (against float64) a candidate may have,
// per contract (ks_bridge/judge.py FACTOR).
inline constexpr double kHighestFactor = 16;
inline constexpr double kHighFactor = 4;
inline constexpr double kMediumFactor = 4;
inline constexpr double kKernelBenchFactor = 16;
inline constexpr double kKernelBenchAtol = 1e-2;
inline constexpr double kKernelBenchRtol = 1e-2;
double ContractFactor(Contract c);

// The PyTorch precision level whose error a contract allows beside fp32's:
// "highest", "high" or "medium" (kernelbench: "highest").
const char* ContractLevel(Contract c);
// The reference data key of an output's bound array at a level: "out@high".
std::string BoundKey(const std::string& output, const std::string& level);

// PyTorch's own float32 output against float64 on one set (the bridge's
// "pytorch_error" of that set), for one output.
struct PyTorchError {
  double rms = 0;
  double rel_norm = 0;
  double max_abs = 0;
  int64_t ill_conditioned = 0;  // elements where PyTorch itself breaks the highest rule
};

// The per-block bound a candidate may add to atol + rtol * |truth| under `c`:
// kHighestFactor x PyTorch's fp32 error per block, and where the contract
// allows a lower precision, its factor x PyTorch's error at that level
// (whichever is larger). `level` may be empty (the level's error equals fp32's).
std::vector<float> CombineBounds(Contract c, const std::vector<float>& highest, const std::vector<float>& level);

// The tolerance of `output` on one set under `c`, beside the per-block bound:
//  - kernelbench: atol = rtol = 1e-2 and nothing else (allclose, as
//    KernelBench's harness);
//  - otherwise the dtype's defaults with the problem's TOLERANCE over them
//    (Signature::ToleranceFor(dtype)), the norm bound widened to the
//    contract's factor times PyTorch's own relative error on this set, where
//    the float64 truth was computed (`own`; null: not measured).
Tolerance ToleranceFor(const Signature& sig, const TensorSpec& output, const PyTorchError* own, Contract c);

// One line for prompts and messages: what a candidate is judged against.
std::string DescribeContract(Contract c);

}  // namespace ks
