// What the GPU worker tests (gpu_worker_e2e_test, slurm_e2e_test) share: a
// small search started on a `serve --evaluator workers`, the leases the server
// logged ("leased candidate(s) 12,13(attempt 2) to W for 3s"), and the check
// that every candidate of a search ended evaluated exactly once.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "store/lineage_store.h"
#include "server/client.h"
#include "tests/e2e/server_harness.h"

namespace ks::e2e {

struct StartedSearch {
  std::unique_ptr<server::Client> client;
  std::string search_id;  // "" after a failure (recorded)
};

// Starts the harness's server, stores a problem and starts a search of it with
// 2 rounds (about 12 candidates).
inline StartedSearch StartSmallSearch(ServerHarness& h) {
  h.Start();
  const int64_t problem = h.SeedProblem();
  StartedSearch out{h.Connect(), ""};
  ::kernelsearch::v1::StartSearchRequest req;
  req.set_problem_id(std::to_string(problem));
  req.mutable_config()->set_rounds(1);
  req.mutable_config()->set_ideas_per_round(2);
  req.mutable_config()->set_branches(2);
  req.mutable_config()->set_beam(1);
  req.mutable_config()->set_repair_attempts(0);
  auto started = out.client->StartSearch(req);
  EXPECT_TRUE(started.ok()) << started.status().ToString();
  if (started.ok()) out.search_id = started->search_id();
  return out;
}

struct LoggedLease {
  int64_t candidate = 0;
  int attempt = 1;
  std::string worker;
};

inline std::vector<LoggedLease> LeasesFromServerLog(const std::string& log) {
  std::vector<LoggedLease> out;
  static const std::regex line(R"(leased candidate\(s\) (.+) to (\S+) for)");
  static const std::regex item(R"((\d+)(?:\(attempt (\d+)\))?)");
  std::istringstream in(log);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    const std::string ids = m[1], worker = m[2];
    for (auto it = std::sregex_iterator(ids.begin(), ids.end(), item); it != std::sregex_iterator(); ++it)
      out.push_back({std::stoll((*it)[1]), (*it)[2].matched ? std::stoi((*it)[2]) : 1, worker});
  }
  return out;
}

// Every candidate of the search has exactly one evaluation in the store and
// none is pending; the evaluator ran (the scripted evaluator's log: one content
// hash per run) for every candidate that was not a copy of an identical one,
// and never twice for one hash, except for `interrupted`: a candidate whose
// worker was stopped with SIGTERM mid-evaluation may have finished that run
// after giving its lease back (wasted work, never stored).
inline void ExpectEachEvaluatedOnce(store::LineageStore* store, int64_t search_id,
                                    const std::vector<std::string>& evaluated_hashes,
                                    const std::set<int64_t>& interrupted = {}) {
  auto cands = store->ListCandidates(search_id);
  ASSERT_TRUE(cands.ok()) << cands.status().ToString();
  ASSERT_FALSE(cands->empty());
  std::set<std::string> own;  // hashes the evaluator had to run
  std::set<std::string> may_repeat;
  for (const auto& c : *cands) {
    EXPECT_TRUE(c.evaluated && c.evaluation) << "candidate " << c.id << " was lost";
    if (c.evaluation && !c.evaluation->reused_from) own.insert(c.content_hash);
    if (interrupted.count(c.id)) may_repeat.insert(c.content_hash);
  }
  std::map<std::string, int> runs;
  for (const auto& h : evaluated_hashes) runs[h]++;
  for (const auto& [hash, n] : runs)
    EXPECT_EQ(n, may_repeat.count(hash) ? std::min(n, 2) : 1) << "evaluated " << n << " times: " << hash;
  for (const auto& hash : own) EXPECT_EQ(runs.count(hash), 1u) << "stored but never evaluated: " << hash;
  EXPECT_EQ(runs.size(), own.size());
  auto pending = store->PendingCandidates(search_id);
  ASSERT_TRUE(pending.ok());
  EXPECT_TRUE(pending->empty());
}

}  // namespace ks::e2e
