// The canonical lineage: what a search's lineage is, independent of row ids
// (they depend on thread timing), so that two runs of one search (one killed
// and resumed, one straight through) can be compared with EXPECT_EQ. One tuple
// per candidate: (round, kind, idea text, parent's content hash, content hash,
// status or "pending"). Uses the lineage store: a test that includes this
// links ks_store.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "store/lineage_store.h"

namespace ks::testing {

using LineageKey = std::tuple<int, std::string, std::string, std::string, std::string, std::string>;

// Read failures fail the test (EXPECT) and give what was read.
inline std::multiset<LineageKey> CanonicalLineage(store::LineageStore* store, int64_t search_id) {
  std::multiset<LineageKey> out;
  auto cands = store->ListCandidates(search_id);
  EXPECT_TRUE(cands.ok()) << cands.status().ToString();
  if (!cands.ok()) return out;
  std::map<int64_t, std::string> hash_of;
  for (const auto& c : *cands) hash_of[c.id] = c.content_hash;
  for (const auto& c : *cands) {
    std::string idea;
    if (c.idea_id) {
      auto row = store->GetIdea(*c.idea_id);
      EXPECT_TRUE(row.ok()) << row.status().ToString();
      if (row.ok()) idea = row->text;
    }
    std::string parent = c.parent_candidate ? hash_of[*c.parent_candidate] : "";
    std::string status = c.evaluation ? EvalStatusName(c.evaluation->status) : "pending";
    out.insert({c.round, store::CandidateKindName(c.kind), idea, parent, c.content_hash, status});
  }
  return out;
}

// The same, of the store in the file `db` (a real binary's).
inline std::multiset<LineageKey> CanonicalLineage(const std::string& db, int64_t search_id) {
  auto store = store::LineageStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return {};
  return CanonicalLineage(store->get(), search_id);
}

}  // namespace ks::testing
