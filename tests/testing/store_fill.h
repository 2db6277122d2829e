// Stores filled the way tests of the store, the server and export need them:
//  - PutCopySearch: the copy problem (as a row: no torch, no signature) and a
//    search of it, where a test adds candidates, leases or practice calls;
//  - StoreCorrectSeed: a problem, a search, one seed candidate and a correct
//    evaluation of it, as a finished search would leave them.
// Failures fail the test (EXPECT) and give 0 ids. Uses the lineage store and
// SearchConfig: a test that includes this links ks_store (and ks_search for
// StoreCorrectSeed).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "search/search_config.h"
#include "store/lineage_store.h"

namespace ks::testing {

struct StoredSearch {
  int64_t problem = 0;
  int64_t search = 0;
};

// The problem row "copy" (copy.py, source "# copy") and a search of it with `config_json`.
inline StoredSearch PutCopySearch(store::LineageStore* store, const std::string& config_json) {
  store::ProblemRow p;
  p.name = "copy";
  p.file_path = "copy.py";
  p.source = "# copy";
  p.sha256 = "sha-copy";
  StoredSearch out;
  auto problem = store->PutProblem(p);
  EXPECT_TRUE(problem.ok()) << problem.status().ToString();
  if (!problem.ok()) return out;
  out.problem = *problem;
  auto search = store->CreateSearch(out.problem, config_json);
  EXPECT_TRUE(search.ok()) << search.status().ToString();
  if (search.ok()) out.search = *search;
  return out;
}

// Returns the candidate id, or 0 after recording a test failure.
inline int64_t StoreCorrectSeed(store::LineageStore* store, const store::ProblemRow& problem_row,
                                const std::string& source, const std::string& plan, const std::string& device,
                                double speedup_eager, const Robustness* robustness = nullptr) {
  auto problem = store->PutProblem(problem_row);
  EXPECT_TRUE(problem.ok()) << problem.status().ToString();
  if (!problem.ok()) return 0;
  auto search = store->CreateSearch(*problem, SearchConfigToJson(SearchConfig{}).dump());
  EXPECT_TRUE(search.ok()) << search.status().ToString();
  if (!search.ok()) return 0;
  store::CandidateRow c;
  c.search_id = *search;
  c.source = source;
  c.plan_json = plan;
  c.kind = store::CandidateKind::kSeed;
  c.slot_key = "r0/seed/b0";
  auto id = store->PutCandidate(c);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  if (!id.ok()) return 0;
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.device = device;
  e.timing = TimingStats{0.05, 0.05, 0.05, 0.05, 0, 20, "runs"};
  e.speedup_eager = speedup_eager;
  if (robustness) e.robustness = *robustness;
  EXPECT_TRUE(store->PutEvaluation(*id, e, std::nullopt).ok());
  return *id;
}

}  // namespace ks::testing
