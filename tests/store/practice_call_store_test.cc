// Agents' practice calls leased to GPU workers (issue 32): what the server's
// agent waits on and what the lease RPCs rest on. Times are passed in, so
// expiry is tested without sleeping.
#include <unistd.h>

#include <filesystem>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "store/lineage_store.h"
#include "tests/testing/store_fill.h"
#include "tests/testing/temp_dir.h"

namespace ks::store {
namespace {

class PracticeCallStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = LineageStore::Open((dir_ / "lineage.db").string());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    auto stored = ks::testing::PutCopySearch(store_.get(), R"({"precision": "high"})");
    problem_ = stored.problem;
    search_ = stored.search;
  }
  void TearDown() override {
    store_.reset();
  }

  int64_t Put(PracticeTool tool, const std::string& source, int64_t search = 0) {
    auto id = store_->PutPracticeCall(search ? search : search_, tool, source, "{\"launches\": []}");
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : 0;
  }
  std::vector<LeasedPracticeCallRow> Lease(const std::string& worker, int max, double now, bool counters = false,
                                           double lease_s = 5) {
    auto l = store_->LeasePracticeCalls(worker, max, lease_s, now, counters);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? *l : std::vector<LeasedPracticeCallRow>{};
  }

  ks::testing::TempDir dir_{"ks_practice_test_"};
  std::unique_ptr<LineageStore> store_;
  int64_t problem_ = 0;
  int64_t search_ = 0;
};

TEST_F(PracticeCallStoreTest, SchemaHasPracticeCalls) { EXPECT_GE(*store_->SchemaVersion(), 8); }

TEST_F(PracticeCallStoreTest, LeasedOldestFirstEachOnceWithWhatTheWorkerNeeds) {
  int64_t a = Put(PracticeTool::kCompile, "a"), b = Put(PracticeTool::kTest, "b");
  auto first = Lease("w1", 1, 1000);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].call.id, a);
  EXPECT_EQ(first[0].call.tool, PracticeTool::kCompile);
  EXPECT_EQ(first[0].call.source, "a");
  EXPECT_EQ(first[0].problem_id, problem_);
  EXPECT_EQ(first[0].precision, "high");  // the search's contract: the worker practises under it
  EXPECT_EQ(first[0].lease_id.size(), 32u);
  EXPECT_EQ(first[0].call.attempts, 1);
  EXPECT_DOUBLE_EQ(first[0].expires_at, 1005);
  auto second = Lease("w2", 5, 1001);
  ASSERT_EQ(second.size(), 1u);  // a is held
  EXPECT_EQ(second[0].call.id, b);
  EXPECT_TRUE(Lease("w3", 5, 1002).empty());
}

TEST_F(PracticeCallStoreTest, TheSameCallPendingIsPutOnceAndRunOnce) {
  int64_t a = Put(PracticeTool::kTest, "same");
  EXPECT_EQ(Put(PracticeTool::kTest, "same"), a);  // a resumed agent asking again
  EXPECT_NE(Put(PracticeTool::kCompile, "same"), a);  // another tool is another call
  auto l = Lease("w", 5, 1000);
  ASSERT_EQ(l.size(), 2u);
  ASSERT_TRUE(store_->CompletePracticeCall(a, l[0].lease_id, "{\"status\": \"correct\"}", "", 1001).ok());
  EXPECT_NE(Put(PracticeTool::kTest, "same"), a);  // a new test of it runs again
}

TEST_F(PracticeCallStoreTest, ExpiredLeaseGoesToTheNextWorkerAndTheDeadOnesReportIsRefused) {
  int64_t a = Put(PracticeTool::kTest, "a");
  auto dead = Lease("dead", 1, 1000);  // its worker is killed: no renewal
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_TRUE(Lease("next", 1, 1004.9).empty());  // still live
  auto next = Lease("next", 1, 1005);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].call.id, a);
  EXPECT_EQ(next[0].call.attempts, 2);
  EXPECT_NE(next[0].lease_id, dead[0].lease_id);
  // The dead worker's result (under its expired lease) is refused and stores nothing.
  Status late = store_->CompletePracticeCall(a, dead[0].lease_id, "{\"status\": \"incorrect\"}", "", 1006);
  EXPECT_EQ(late.code(), Code::kFailedPrecondition) << late.ToString();
  EXPECT_EQ(store_->GetPracticeCall(a)->state, PracticeCallState::kPending);
  ASSERT_TRUE(store_->CompletePracticeCall(a, next[0].lease_id, "{\"status\": \"correct\"}", "", 1006).ok());
  auto row = store_->GetPracticeCall(a);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, PracticeCallState::kDone);
  EXPECT_EQ(row->result_json, "{\"status\": \"correct\"}");
  EXPECT_EQ(row->worker, "next");
  // Reported once: a second report under the same lease is refused too.
  EXPECT_EQ(store_->CompletePracticeCall(a, next[0].lease_id, "{}", "", 1007).code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Lease("any", 5, 2000).empty());
}

TEST_F(PracticeCallStoreTest, RenewKeepsItsShortLeaseAndReleaseHandsItBack) {
  int64_t a = Put(PracticeTool::kTest, "a");
  auto l = Lease("w", 1, 1000, false, 3);
  ASSERT_EQ(l.size(), 1u);
  // A renewal asking for 60 s extends a practice lease by its own 3 s only.
  auto lost = store_->RenewLeases({l[0].lease_id}, 60, 1002, /*release=*/false);
  ASSERT_TRUE(lost.ok() && lost->empty());
  EXPECT_TRUE(Lease("other", 1, 1004.9).empty());
  EXPECT_EQ(Lease("other", 1, 1005.1, false, 3).size(), 1u);  // 1002 + 3: expired
  // The new holder gives it back: the next worker takes it at once.
  auto held = store_->LeasePracticeCalls("third", 1, 3, 1005.2, false);
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE(held->empty());
  auto again = Lease("w2", 1, 1010);
  ASSERT_EQ(again.size(), 1u);
  lost = store_->RenewLeases({again[0].lease_id}, 60, 1011, /*release=*/true);
  ASSERT_TRUE(lost.ok() && lost->empty());
  auto after = Lease("w3", 1, 1011);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].call.id, a);
  // An expired lease is reported lost to the renewer.
  lost = store_->RenewLeases({again[0].lease_id}, 60, 1012, false);
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(lost->size(), 1u);
}

TEST_F(PracticeCallStoreTest, ProfileCallsGoOnlyToWorkersThatReadCounters) {
  int64_t p = Put(PracticeTool::kProfile, "p");
  int64_t t = Put(PracticeTool::kTest, "t");
  auto plain = Lease("plain", 5, 1000, /*counters=*/false);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].call.id, t);
  auto ncu = Lease("ncu", 5, 1000, /*counters=*/true);
  ASSERT_EQ(ncu.size(), 1u);
  EXPECT_EQ(ncu[0].call.id, p);
}

TEST_F(PracticeCallStoreTest, AbandonedAndEndedSearchesCallsAreNotLeased) {
  int64_t a = Put(PracticeTool::kTest, "a");
  ASSERT_TRUE(store_->AbandonPracticeCall(a).ok());
  EXPECT_EQ(store_->GetPracticeCall(a)->state, PracticeCallState::kAbandoned);
  EXPECT_TRUE(Lease("w", 5, 1000).empty());
  Put(PracticeTool::kTest, "b");
  ASSERT_TRUE(store_->SetSearchStatus(search_, SearchStatus::kCancelled, "cancelled").ok());
  EXPECT_TRUE(Lease("w", 5, 1000).empty());
  // A search left pending by a server's shutdown keeps its calls for the resumed agent.
  ASSERT_TRUE(store_->SetSearchStatus(search_, SearchStatus::kPending, "interrupted by server shutdown").ok());
  EXPECT_EQ(Lease("w", 5, 1000).size(), 1u);
}

TEST_F(PracticeCallStoreTest, AWorkersFailureIsStoredForTheAgent) {
  int64_t a = Put(PracticeTool::kTest, "a");
  auto l = Lease("w", 1, 1000);
  ASSERT_EQ(l.size(), 1u);
  ASSERT_TRUE(store_->CompletePracticeCall(a, l[0].lease_id, "", "no torch on this node", 1001).ok());
  auto row = store_->GetPracticeCall(a);
  EXPECT_EQ(row->state, PracticeCallState::kFailed);
  EXPECT_EQ(row->error, "no torch on this node");
}

TEST_F(PracticeCallStoreTest, ACallWhoseWorkersKeepDyingFailsAfterItsAttempts) {
  int64_t a = Put(PracticeTool::kTest, "a");
  double now = 1000;
  for (int i = 0; i < kMaxPracticeAttempts; ++i) {
    auto l = Lease("dying", 1, now);
    ASSERT_EQ(l.size(), 1u) << i;
    now += 10;  // expired
  }
  EXPECT_TRUE(Lease("next", 1, now).empty());
  auto row = store_->GetPracticeCall(a);
  EXPECT_EQ(row->state, PracticeCallState::kFailed);
  EXPECT_NE(row->error.find("leased 5 times"), std::string::npos) << row->error;
}

TEST_F(PracticeCallStoreTest, ConcurrentWorkersNeverShareACall) {
  for (int i = 0; i < 40; ++i) Put(PracticeTool::kTest, "c" + std::to_string(i));
  std::mutex mu;
  std::multiset<int64_t> seen;
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&, w] {
      for (int k = 0; k < 20; ++k) {
        auto l = store_->LeasePracticeCalls("w" + std::to_string(w), 3, 60, 1000, false);
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& r : *l) seen.insert(r.call.id);
      }
    });
  for (auto& t : workers) t.join();
  EXPECT_EQ(seen.size(), 40u);
  for (int64_t id : seen) EXPECT_EQ(seen.count(id), 1u) << id;
}

}  // namespace
}  // namespace ks::store
