#include "search/kernel_bank.h"

#include <algorithm>
#include <regex>

namespace ks {

std::set<std::string> OperatorSet(const std::string& source) {
  // Helpers that build inputs or name dtypes say nothing about the operator.
  static const std::set<std::string> kNotOperators = {
      "randn", "rand", "randint", "randn_like", "rand_like", "zeros", "ones", "empty", "full", "arange", "tensor",
      "manual_seed", "Module", "Parameter", "Tensor", "Size", "device", "no_grad", "float16", "float32", "float64",
      "bfloat16", "half", "float", "int8", "int32", "int64", "long", "bool", "functional", "nn", "cuda"};
  static const std::regex kCall(R"((?:torch\.nn\.functional|torch\.nn|torch|F|nn)\.([A-Za-z_][A-Za-z0-9_]*))");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(source.begin(), source.end(), kCall); it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[1].str();
    if (!kNotOperators.count(name)) out.insert(name);
  }
  return out;
}

double OperatorSimilarity(const std::set<std::string>& a, const std::set<std::string>& b) {
  if (a.empty() || b.empty()) return 0;
  size_t common = 0;
  for (const auto& x : a) common += b.count(x);
  return static_cast<double>(common) / static_cast<double>(a.size() + b.size() - common);
}

std::vector<BankKernel> SelectBankKernels(const std::string& problem_source,
                                          const std::vector<store::BankEntry>& entries, size_t max_kernels) {
  std::set<std::string> ours = OperatorSet(problem_source);
  struct Scored {
    double similarity;
    double speedup;
    const store::BankEntry* entry;
  };
  std::vector<Scored> scored;
  for (const auto& e : entries) {
    double s = OperatorSimilarity(ours, OperatorSet(e.problem.source));
    if (s < kBankMinSimilarity || !e.candidate.evaluation) continue;
    scored.push_back({s, e.candidate.evaluation->speedup_eager.value_or(0), &e});
  }
  // Closest operator first, then the faster kernel, then the older problem (stable across runs).
  std::sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) {
    if (a.similarity != b.similarity) return a.similarity > b.similarity;
    if (a.speedup != b.speedup) return a.speedup > b.speedup;
    return a.entry->problem.id < b.entry->problem.id;
  });
  std::vector<BankKernel> out;
  for (const auto& s : scored) {
    if (out.size() >= max_kernels) break;
    const auto& c = s.entry->candidate;
    out.push_back(BankKernel{.candidate_id = c.id, .problem_name = s.entry->problem.name, .source = c.source,
                             .plan_json = c.plan_json, .median_ms = c.evaluation->median_ms,
                             .speedup_eager = c.evaluation->speedup_eager,
                             .speedup_compile = c.evaluation->speedup_compile});
  }
  return out;
}

}  // namespace ks
