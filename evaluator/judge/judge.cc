#include "evaluator/judge/judge.h"

#include <algorithm>
#include <cmath>

namespace ks {

StatusOr<Contract> ParseContract(const std::string& name) {
  if (name == "highest" || name == "fp32") return Contract::kHighest;
  if (name == "high" || name == "tf32") return Contract::kHigh;
  if (name == "medium") return Contract::kMedium;
  if (name == "kernelbench") return Contract::kKernelBench;
  return InvalidArgument("unknown precision contract '" + name +
                         "': use highest, high, medium or kernelbench (fp32 and tf32 are aliases of highest and high)");
}

const char* ContractName(Contract c) {
  switch (c) {
    case Contract::kHighest: return "highest";
    case Contract::kHigh: return "high";
    case Contract::kMedium: return "medium";
    case Contract::kKernelBench: return "kernelbench";
  }
  return "highest";
}

std::vector<std::string> ContractNames() { return {"highest", "high", "medium", "kernelbench", "fp32", "tf32"}; }

std::string CanonicalContract(const std::string& name) {
  auto c = ParseContract(name);
  return c.ok() ? ContractName(*c) : name;
}

double ContractFactor(Contract c) {
  switch (c) {
    case Contract::kHighest: return kHighestFactor;
    case Contract::kHigh: return kHighFactor;
    case Contract::kMedium: return kMediumFactor;
    case Contract::kKernelBench: return kKernelBenchFactor;
  }
  return kHighestFactor;
}

const char* ContractLevel(Contract c) {
  switch (c) {
    case Contract::kHigh: return "high";
    case Contract::kMedium: return "medium";
    default: return "highest";
  }
}

std::string BoundKey(const std::string& output, const std::string& level) { return output + "@" + level; }

std::vector<float> CombineBounds(Contract c, const std::vector<float>& highest, const std::vector<float>& level) {
  std::vector<float> out(highest.size());
  const double f = ContractFactor(c);
  for (size_t i = 0; i < highest.size(); ++i) {
    double b = kHighestFactor * static_cast<double>(highest[i]);
    if (i < level.size() && (c == Contract::kHigh || c == Contract::kMedium))
      b = std::max(b, f * static_cast<double>(level[i]));
    out[i] = std::isnan(b) ? INFINITY : static_cast<float>(std::min<double>(b, 3.0e38));
    if (std::isinf(b)) out[i] = INFINITY;
  }
  return out;
}

Tolerance ToleranceFor(const Signature& sig, const TensorSpec& output, const PyTorchError* own, Contract c) {
  if (c == Contract::kKernelBench) {
    if (!IsFloating(output.dtype)) return sig.ToleranceFor(output.dtype);
    return Tolerance{kKernelBenchAtol, kKernelBenchRtol, 0, 0, 0};
  }
  Tolerance t = sig.ToleranceFor(output.dtype);
  if (own && t.rel_norm > 0 && std::isfinite(own->rel_norm)) {
    const double f = std::max(ContractFactor(c), kHighestFactor);
    t.rel_norm = std::max(t.rel_norm, f * own->rel_norm);
    // large_rel stays 20 times the norm bound, as Signature::ToleranceFor does.
    if (t.large_rel > 0) t.large_rel = std::max(t.large_rel, 20 * f * own->rel_norm);
  }
  return t;
}

std::string DescribeContract(Contract c) {
  switch (c) {
    case Contract::kHighest:
      return "precision contract 'highest': outputs are compared with the model run in float64, within the dtype's "
             "atol/rtol plus " + std::to_string(static_cast<int>(kHighestFactor)) +
             "x PyTorch's own float32 error in each block of " + std::to_string(kBoundBlock) + " elements";
    case Contract::kHigh:
      return "precision contract 'high' (torch.set_float32_matmul_precision(\"high\")): compared with float64, "
             "TF32-class matmul and convolution error allowed (" + std::to_string(static_cast<int>(kHighFactor)) +
             "x PyTorch's own error with TF32 on, per block)";
    case Contract::kMedium:
      return "precision contract 'medium' (torch.set_float32_matmul_precision(\"medium\")): compared with float64, "
             "bf16-class matmul error allowed (" + std::to_string(static_cast<int>(kMediumFactor)) +
             "x PyTorch's own error at that precision, per block)";
    case Contract::kKernelBench:
      return "precision contract 'kernelbench': KernelBench's rule, atol = rtol = 1e-2 on the get_inputs() sets; "
             "speedups against the faster of eager and torch.compile";
  }
  return "";
}

}  // namespace ks
