// Leases on pending candidates in the lineage store (issue 13): what the
// server's lease RPCs rest on. Times are passed in, so expiry is tested
// without sleeping.
#include <unistd.h>

#include <filesystem>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "search/search_config.h"
#include "store/lineage_store.h"
#include "tests/testing/store_fill.h"
#include "tests/testing/temp_dir.h"

namespace ks::store {
namespace {

class LeaseStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = LineageStore::Open((dir_ / "lineage.db").string());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    auto stored = ks::testing::PutCopySearch(store_.get(), SearchConfigToJson(SearchConfig{}).dump());
    problem_ = stored.problem;
    search_ = stored.search;
  }
  void TearDown() override {
    store_.reset();
  }

  int64_t AddCandidate(const std::string& source, int64_t search = 0) {
    CandidateRow c;
    c.search_id = search ? search : search_;
    c.source = source;
    c.plan_json = "{}";
    c.slot_key = "slot/" + std::to_string(next_slot_++);
    auto id = store_->PutCandidate(c);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return *id;
  }

  static Evaluation Correct(double ms) {
    Evaluation e;
    e.status = EvalStatus::kCorrect;
    e.timing = TimingStats{ms, ms, ms, ms, 0, 10};
    e.speedup_eager = 2.0 / ms;
    return e;
  }

  ks::testing::TempDir dir_{"ks_lease_test_"};
  std::unique_ptr<LineageStore> store_;
  int64_t problem_ = 0;
  int64_t search_ = 0;
  int next_slot_ = 0;
};

TEST_F(LeaseStoreTest, SchemaHasLeases) { EXPECT_GE(*store_->SchemaVersion(), 6); }  // 7: attempts (issue 24)

TEST_F(LeaseStoreTest, LeasesOldestFirstEachOnce) {
  int64_t a = AddCandidate("a"), b = AddCandidate("b"), c = AddCandidate("c");
  auto first = store_->LeaseCandidates("w1", 2, 30, 1000);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].candidate.id, a);
  EXPECT_EQ((*first)[1].candidate.id, b);
  EXPECT_EQ((*first)[0].problem_id, problem_);
  EXPECT_EQ((*first)[0].lease_id.size(), 32u);
  EXPECT_NE((*first)[0].lease_id, (*first)[1].lease_id);
  EXPECT_EQ((*first)[0].attempts, 1);
  auto second = store_->LeaseCandidates("w2", 5, 30, 1001);
  ASSERT_EQ(second->size(), 1u);
  EXPECT_EQ((*second)[0].candidate.id, c);
  EXPECT_TRUE(store_->LeaseCandidates("w3", 5, 30, 1002)->empty());
  auto counts = store_->PendingAndLeased(search_, 1002);
  EXPECT_EQ(counts->first, 3);
  EXPECT_EQ(counts->second, 3);
}

TEST_F(LeaseStoreTest, ExpiredLeaseGoesToTheNextWorkerAndTheOldOneIsRefused) {
  int64_t a = AddCandidate("a");
  auto w1 = store_->LeaseCandidates("w1", 1, 10, 1000);
  ASSERT_EQ(w1->size(), 1u);
  // w1 dies: nothing renews; at 1010 the lease is over.
  EXPECT_TRUE(store_->LeaseCandidates("w2", 1, 10, 1009)->empty());
  auto w2 = store_->LeaseCandidates("w2", 1, 10, 1010);
  ASSERT_EQ(w2->size(), 1u);
  EXPECT_EQ((*w2)[0].candidate.id, a);
  EXPECT_EQ((*w2)[0].attempts, 2);
  // A late result under the dead lease is refused; the live one is stored once.
  auto late = store_->CompleteLease(a, (*w1)[0].lease_id, Correct(1), 1011);
  EXPECT_EQ(late.status().code(), Code::kFailedPrecondition);
  auto done = store_->CompleteLease(a, (*w2)[0].lease_id, Correct(1), 1012);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->stored, 1);
  EXPECT_EQ(done->searches, std::vector<int64_t>{search_});
  EXPECT_EQ(store_->CompleteLease(a, (*w2)[0].lease_id, Correct(1), 1013).status().code(),
            Code::kFailedPrecondition)
      << "a second report of the same lease stores nothing";
  auto c = store_->GetCandidate(a);
  ASSERT_TRUE(c->evaluation.has_value());
  EXPECT_TRUE(store_->PendingCandidates(search_)->empty());
  EXPECT_TRUE(store_->LeaseCandidates("w3", 1, 10, 2000)->empty());
}

TEST_F(LeaseStoreTest, RenewKeepsAndReleaseHandsBack) {
  AddCandidate("a");
  AddCandidate("b");
  auto l = store_->LeaseCandidates("w1", 2, 10, 1000);
  ASSERT_EQ(l->size(), 2u);
  const std::string la = (*l)[0].lease_id, lb = (*l)[1].lease_id;
  auto lost = store_->RenewLeases({la, lb, std::string(32, '0')}, 10, 1008, false);
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(*lost, std::vector<std::string>{std::string(32, '0')});
  EXPECT_TRUE(store_->LeaseCandidates("w2", 2, 10, 1015)->empty()) << "renewed to 1018";
  // Released: free at once.
  EXPECT_TRUE(store_->RenewLeases({lb}, 10, 1016, true)->empty());
  auto w2 = store_->LeaseCandidates("w2", 2, 10, 1016);
  ASSERT_EQ(w2->size(), 1u);
  EXPECT_NE((*w2)[0].lease_id, lb);
  // An expired lease cannot be renewed back.
  EXPECT_EQ(store_->RenewLeases({la}, 10, 1030, false)->size(), 1u);
}

TEST_F(LeaseStoreTest, IdenticalCandidatesAreEvaluatedOnce) {
  int64_t search2 = *store_->CreateSearch(problem_, SearchConfigToJson(SearchConfig{}).dump());
  int64_t a = AddCandidate("same"), b = AddCandidate("same", search2), c = AddCandidate("other");
  auto l = store_->LeaseCandidates("w1", 5, 10, 1000);
  ASSERT_EQ(l->size(), 2u) << "the twin waits for the first one's result";
  EXPECT_EQ((*l)[0].candidate.id, a);
  EXPECT_EQ((*l)[1].candidate.id, c);
  auto done = store_->CompleteLease(a, (*l)[0].lease_id, Correct(0.5), 1001);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->stored, 2);
  EXPECT_EQ(done->searches.size(), 2u);
  auto twin = store_->GetCandidate(b);
  ASSERT_TRUE(twin->evaluation.has_value());
  EXPECT_EQ(twin->evaluation->reused_from, a);
  // A later identical candidate is copied at lease time, never leased.
  int64_t d = AddCandidate("same");
  auto again = store_->LeaseCandidates("w1", 5, 10, 1002);
  EXPECT_TRUE(again->empty());
  EXPECT_EQ(store_->GetCandidate(d)->evaluation->reused_from, a);
}

TEST_F(LeaseStoreTest, EachSearchStoresAWorkersReportUnderItsOwnRobustPolicy) {
  // serve --evaluator workers: the server sets the search policy on its store.
  store_->SetEvaluationPolicy(ApplySearchPolicy);
  SearchConfig strict_config;
  strict_config.require_robust = true;
  int64_t strict = *store_->CreateSearch(problem_, SearchConfigToJson(strict_config).dump());
  int64_t a = AddCandidate("split-fp16 gemm", strict), b = AddCandidate("split-fp16 gemm");
  auto l = store_->LeaseCandidates("w1", 5, 10, 1000);
  ASSERT_EQ(l->size(), 1u);
  ASSERT_EQ((*l)[0].candidate.id, a);
  // The worker's report: correct on get_inputs(), broken by a shifted set.
  Evaluation specialised = Correct(0.5);
  specialised.robustness = Robustness{};
  specialised.robustness->checks = {{"get_inputs", "held", "3 input sets"},
                                    {"scale_up", "broke", "x 1e5: relative norm 1 over 1e-5"}};
  specialised.robustness->broken_by = "scale_up";
  ASSERT_TRUE(store_->CompleteLease(a, (*l)[0].lease_id, specialised, 1001).ok());
  auto strict_row = store_->GetCandidate(a);
  EXPECT_EQ(strict_row->evaluation->status, EvalStatus::kIncorrect) << "--require robust: specialised is incorrect";
  EXPECT_NE(strict_row->evaluation->evaluation_json.find("robust kernels required"), std::string::npos);
  auto lenient_row = store_->GetCandidate(b);
  EXPECT_EQ(lenient_row->evaluation->status, EvalStatus::kCorrect) << "the twin's search does not require robust";
  EXPECT_EQ(lenient_row->evaluation->reused_from, a);
  EXPECT_NE(lenient_row->evaluation->evaluation_json.find("\"broken_by\":\"scale_up\""), std::string::npos);
  // Copied at lease time from the strict search's (incorrect) row: each under its own policy again.
  int64_t c = AddCandidate("split-fp16 gemm"), d = AddCandidate("split-fp16 gemm", strict);
  EXPECT_TRUE(store_->LeaseCandidates("w1", 5, 10, 1002)->empty());
  EXPECT_EQ(store_->GetCandidate(c)->evaluation->status, EvalStatus::kCorrect);
  EXPECT_EQ(store_->GetCandidate(d)->evaluation->status, EvalStatus::kIncorrect);
  auto best = store_->BestCorrect(strict);
  ASSERT_TRUE(best.ok());
  EXPECT_FALSE(best->has_value()) << "the strict search has no correct kernel";
}

TEST_F(LeaseStoreTest, AnEvaluationIsSharedOnlyUnderOnePrecisionContract) {
  // Stored under the alias, as an older version did: the store keeps the text.
  nlohmann::json tf32_config = SearchConfigToJson(SearchConfig{});
  tf32_config["precision"] = "tf32";
  int64_t tf32 = *store_->CreateSearch(problem_, tf32_config.dump());
  int64_t a = AddCandidate("same"), b = AddCandidate("same", tf32);
  // Not twins: both leased at once, each with its search's contract for the worker.
  auto l = store_->LeaseCandidates("w1", 5, 10, 1000);
  ASSERT_EQ(l->size(), 2u);
  EXPECT_EQ((*l)[0].candidate.id, a);
  EXPECT_EQ((*l)[0].precision, "highest");
  EXPECT_EQ((*l)[1].candidate.id, b);
  EXPECT_EQ((*l)[1].precision, "tf32");
  auto done = store_->CompleteLease(b, (*l)[1].lease_id, Correct(0.5), 1001);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->stored, 1) << "a tf32 result is not copied to the fp32 search's candidate";
  EXPECT_FALSE(store_->GetCandidate(a)->evaluation.has_value());
  // A later tf32 twin is copied at lease time; a later fp32 one waits for a's own result.
  int64_t c = AddCandidate("same", tf32), d = AddCandidate("same");
  auto again = store_->LeaseCandidates("w1", 5, 10, 1002);
  EXPECT_TRUE(again->empty()) << "c is copied, d waits for a (leased)";
  EXPECT_EQ(store_->GetCandidate(c)->evaluation->reused_from, b);
  EXPECT_FALSE(store_->GetCandidate(d)->evaluation.has_value());
  ASSERT_TRUE(store_->CompleteLease(a, (*l)[0].lease_id, Correct(0.6), 1003).ok());
  EXPECT_EQ(store_->GetCandidate(d)->evaluation->reused_from, a);
  // The orchestrator's reuse (local searches) looks under the same contract.
  EXPECT_EQ((*store_->FindEvaluatedByHash(problem_, store_->GetCandidate(a)->content_hash, "tf32"))->id, b);
  EXPECT_EQ((*store_->FindEvaluatedByHash(problem_, store_->GetCandidate(a)->content_hash, "highest"))->id, a);
}

TEST_F(LeaseStoreTest, EvaluatedElsewhereWhileLeasedRefusesTheLateReport) {
  int64_t a = AddCandidate("a");
  auto l = store_->LeaseCandidates("w1", 1, 60, 1000);
  ASSERT_EQ(l->size(), 1u);
  // evaluate-pending on the same store got there first.
  ASSERT_TRUE(store_->PutEvaluation(a, Correct(1), std::nullopt).ok());
  EXPECT_EQ(store_->CompleteLease(a, (*l)[0].lease_id, Correct(2), 1001).status().code(),
            Code::kFailedPrecondition);
  EXPECT_EQ(*store_->RenewLeases({(*l)[0].lease_id}, 60, 1002, false), std::vector<std::string>{(*l)[0].lease_id})
      << "its lease ended with the evaluation";
  EXPECT_EQ(*store_->GetCandidate(a)->evaluation->median_ms, 1);
}

TEST_F(LeaseStoreTest, CancelledSearchesAreNotLeased) {
  AddCandidate("a");
  ASSERT_TRUE(store_->SetSearchStatus(search_, SearchStatus::kCancelled, "cancelled").ok());
  EXPECT_TRUE(store_->LeaseCandidates("w1", 5, 10, 1000)->empty());
  ASSERT_TRUE(store_->SetSearchStatus(search_, SearchStatus::kPending, "interrupted by server shutdown").ok());
  EXPECT_EQ(store_->LeaseCandidates("w1", 5, 10, 1000)->size(), 1u);
}

TEST_F(LeaseStoreTest, PreferredProblemComesFirst) {
  ProblemRow p;
  p.name = "other";
  p.file_path = "other.py";
  p.source = "# other";
  p.sha256 = "sha-other";
  int64_t other = *store_->PutProblem(p);
  int64_t other_search = *store_->CreateSearch(other, SearchConfigToJson(SearchConfig{}).dump());
  int64_t a = AddCandidate("a");
  int64_t b = AddCandidate("b", other_search);
  auto l = store_->LeaseCandidates("w1", 1, 10, 1000, other);
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].candidate.id, b);
  EXPECT_EQ((*l)[0].problem_id, other);
  l = store_->LeaseCandidates("w1", 1, 10, 1000, other);
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].candidate.id, a) << "then the others, oldest first";
}

TEST_F(LeaseStoreTest, ConcurrentWorkersNeverShareACandidate) {
  for (int i = 0; i < 60; ++i) AddCandidate("k" + std::to_string(i));
  std::mutex mu;
  std::multiset<int64_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      auto own = LineageStore::Open((dir_ / "lineage.db").string());  // a connection per worker, as processes
      ASSERT_TRUE(own.ok());
      for (;;) {
        auto l = (*own)->LeaseCandidates("w" + std::to_string(t), 3, 60, 1000);
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        if (l->empty()) return;
        for (const auto& x : *l) {
          ASSERT_TRUE((*own)->CompleteLease(x.candidate.id, x.lease_id, Correct(1), 1001).ok());
          std::lock_guard<std::mutex> lock(mu);
          seen.insert(x.candidate.id);
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(seen.size(), 60u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 60u);
  EXPECT_TRUE(store_->PendingCandidates(search_)->empty());
}

}  // namespace
}  // namespace ks::store
