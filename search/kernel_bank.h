// The kernel bank: the best correct kernels the store already holds for other
// problems, offered to a new search as examples (round 0's implement prompts
// and every ideas prompt), with what they measured.
//
// Which problems count as similar, kept simple on purpose so that a user can
// predict it: the "operator signature" of a problem is the set of torch
// operations its source names (`torch.X`, `F.X`, `nn.X`, `torch.nn.functional.X`,
// minus the tensor-construction helpers every problem file uses in
// get_inputs(): randn, zeros, float32, ...). Two problems are similar when the
// Jaccard overlap of these sets is at least 0.5; the same operator at other
// shapes has the same set (overlap 1). Among similar problems the closest come
// first, then the faster kernel. Pure functions; thread-safe.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "search/prompts.h"
#include "store/lineage_store.h"

namespace ks {

inline constexpr double kBankMinSimilarity = 0.5;
inline constexpr size_t kBankMaxKernels = 2;  // a prompt stays readable; more examples add little

// The torch operations a problem's source names, e.g. {"softmax"} or {"Conv2d", "relu"}.
std::set<std::string> OperatorSet(const std::string& problem_source);
// Jaccard overlap of two operator sets; 0 when either is empty.
double OperatorSimilarity(const std::set<std::string>& a, const std::set<std::string>& b);

// Up to `max_kernels` bank kernels for a problem with source `problem_source`,
// from the store's per-problem best kernels (LineageStore::BankCandidates).
std::vector<BankKernel> SelectBankKernels(const std::string& problem_source,
                                          const std::vector<store::BankEntry>& entries,
                                          size_t max_kernels = kBankMaxKernels);

}  // namespace ks
