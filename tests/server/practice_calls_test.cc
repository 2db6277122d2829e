// Agents' practice calls through GPU workers (issue 32): the waiting side
// (PracticeCalls and the agent's practice evaluator: a result reported by a
// worker answers the call; no worker within the deadline, or the search
// stopping, is a clear error and the call is dropped) and the service's part
// (LeaseCandidates hands practice calls out before candidates, ReportPractice
// stores a result only under its live lease), through the real service on an
// in-process gRPC channel.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"
#include "proto/kernelsearch.grpc.pb.h"
#include "server/auth.h"
#include "server/job_manager.h"
#include "server/practice_calls.h"
#include "server/search_runner.h"
#include "server/service.h"
#include "server/watch_hub.h"
#include "store/lineage_store.h"
#include "tests/server/service_fixture.h"
#include "tests/testing/store_fill.h"

namespace ks::server {
namespace {

namespace pb = ::kernelsearch::v1;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

const Candidate kDraft{"extern \"C\" __global__ void k() {}", R"({"launches": []})"};

double Now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

Evaluation Correct(double ms) {
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.timing = TimingStats{ms, ms, ms, ms, 0, 10};
  return e;
}

class PracticeCallsTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (HasFatalFailure()) return;
    auto stored = ks::testing::PutCopySearch(store_.get(), R"({"implement": "agent"})");
    problem_ = stored.problem;
    search_ = stored.search;
  }

  // A GPU worker's part, played on the store: leases the next practice call
  // and answers it with `result` (then pokes the waiters, as ReportPractice does).
  std::thread FakeWorker(PracticeCalls* calls, std::string result) {
    return std::thread([this, calls, result] {
      for (int i = 0; i < 500; ++i) {
        auto l = store_->LeasePracticeCalls("fake/gpu0", 1, 5, Now(), /*reads_counters=*/true);
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        if (!l->empty()) {
          ASSERT_TRUE(store_->CompletePracticeCall(l->front().call.id, l->front().lease_id, result, "", Now()).ok());
          calls->Poke();
          return;
        }
        std::this_thread::sleep_for(10ms);
      }
      ADD_FAILURE() << "no practice call was put";
    });
  }

  void StartService(PracticeCalls* calls) {
    ServiceTest::StartService([calls](ServiceDeps& deps) { deps.practice_calls = calls; });
  }
  grpc::Status Lease(int max, bool serves_practice, pb::LeaseCandidatesResponse* resp) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    pb::LeaseCandidatesRequest req;
    req.set_worker("w/gpu0");
    req.set_max_candidates(max);
    req.set_lease_seconds(60);
    req.set_serves_practice(serves_practice);
    return stub_->LeaseCandidates(&ctx, req, resp);
  }
  grpc::Status Report(const std::string& id, const std::string& lease, const std::string& result_json) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    pb::ReportPracticeRequest req;
    req.set_id(id);
    req.set_lease_id(lease);
    req.set_result_json(result_json);
    pb::ReportPracticeResponse resp;
    return stub_->ReportPractice(&ctx, req, &resp);
  }

  int64_t problem_ = 0;
  int64_t search_ = 0;
};

TEST_F(PracticeCallsTest, AWorkersResultAnswersTheAgentsTestAndCompile) {
  PracticeCalls calls(store_.get(), {.deadline_s = 30, .poll_s = 0.05});
  auto ev = calls.EvaluatorFor(search_, nullptr);
  std::thread worker = FakeWorker(&calls, EvaluationToJson(Correct(0.25)).dump());
  auto out = ev->EvaluateBatch({kDraft});
  worker.join();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].status, EvalStatus::kCorrect);
  EXPECT_DOUBLE_EQ((*out)[0].timing->median_ms, 0.25);
  auto row = store_->GetPracticeCall(1);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->tool, store::PracticeTool::kTest);
  EXPECT_EQ(row->worker, "fake/gpu0");

  Evaluation compiled;
  compiled.status = EvalStatus::kCompileError;
  compiled.compile_log = "error: expected ';'";
  worker = FakeWorker(&calls, EvaluationToJson(compiled).dump());
  auto c = ev->CompileOnly(kDraft);
  worker.join();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->status, EvalStatus::kCompileError);
  EXPECT_EQ(c->compile_log, "error: expected ';'");
  EXPECT_EQ(store_->GetPracticeCall(2)->tool, store::PracticeTool::kCompile);
}

TEST_F(PracticeCallsTest, NoWorkerWithinTheDeadlineIsAClearErrorAndTheCallIsDropped) {
  PracticeCalls calls(store_.get(), {.deadline_s = 0.3, .poll_s = 0.05});
  auto ev = calls.EvaluatorFor(search_, nullptr);
  auto out = ev->EvaluateBatch({kDraft});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kDeadlineExceeded);
  EXPECT_THAT(out.status().message(), HasSubstr("no GPU worker answered the test call within 0.3 s"));
  EXPECT_THAT(out.status().message(), HasSubstr("kernelsearch gpu-worker"));
  EXPECT_EQ(store_->GetPracticeCall(1)->state, store::PracticeCallState::kAbandoned);
  auto late = store_->LeasePracticeCalls("late", 5, 5, Now(), true);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->empty());  // no worker runs it for nobody
  // The profile tool answers a report whose note says so (the agent's tool error).
  auto reports = ev->ReadCounters({kDraft});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].launches.empty());
  EXPECT_THAT(reports[0].note, HasSubstr("no GPU worker answered the profile call"));
}

TEST_F(PracticeCallsTest, AStoppingSearchDropsItsCall) {
  PracticeCalls calls(store_.get(), {.deadline_s = 30, .poll_s = 0.05});
  std::atomic<bool> stop{false};
  auto ev = calls.EvaluatorFor(search_, &stop);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    stop = true;
  });
  auto t0 = std::chrono::steady_clock::now();
  auto out = ev->CompileOnly(kDraft);
  stopper.join();
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kCancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(store_->GetPracticeCall(1)->state, store::PracticeCallState::kAbandoned);
}

TEST_F(PracticeCallsTest, AWorkersFailureFailsTheCallWithItsReason) {
  PracticeCalls calls(store_.get(), {.deadline_s = 30, .poll_s = 0.05});
  std::thread worker([&] {
    for (int i = 0; i < 500; ++i) {
      auto l = store_->LeasePracticeCalls("w", 1, 5, Now(), false);
      if (l.ok() && !l->empty()) {
        ASSERT_TRUE(store_->CompletePracticeCall(l->front().call.id, l->front().lease_id, "", "no torch here", Now())
                        .ok());
        calls.Poke();
        return;
      }
      std::this_thread::sleep_for(10ms);
    }
  });
  auto out = calls.EvaluatorFor(search_, nullptr)->EvaluateBatch({kDraft});
  worker.join();
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("no torch here"));
}

TEST_F(PracticeCallsTest, ProfileIsOfferedOnlyWhileAWorkerThatReadsCountersIsAround) {
  PracticeCalls calls(store_.get(), {});
  auto ev = calls.EvaluatorFor(search_, nullptr);
  EXPECT_FALSE(ev->CanReadCounters());
  calls.WorkerSeen(false);
  EXPECT_FALSE(ev->CanReadCounters());
  calls.WorkerSeen(true);
  EXPECT_TRUE(ev->CanReadCounters());
  PracticeCalls forgetful(store_.get(), {.worker_memory_s = 0.05});
  forgetful.WorkerSeen(true);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(forgetful.EvaluatorFor(search_, nullptr)->CanReadCounters());
}

TEST_F(PracticeCallsTest, LeaseCandidatesHandsPracticeCallsOutBeforeCandidates) {
  PracticeCalls calls(store_.get(), {});
  StartService(&calls);
  store::CandidateRow c;
  c.search_id = search_;
  c.source = "older candidate";
  c.plan_json = "{}";
  c.slot_key = "r0/i1/b0";
  const int64_t candidate = *store_->PutCandidate(c);  // pending before the call
  const int64_t call = *store_->PutPracticeCall(search_, store::PracticeTool::kTest, kDraft.source, kDraft.plan_json);

  pb::LeaseCandidatesResponse first;
  ASSERT_TRUE(Lease(1, true, &first).ok());
  ASSERT_EQ(first.practice_calls_size(), 1);
  EXPECT_EQ(first.candidates_size(), 0);  // the one slot went to the waiting agent
  const pb::LeasedPracticeCall& p = first.practice_calls(0);
  EXPECT_EQ(p.id(), std::to_string(call));
  EXPECT_EQ(p.tool(), "test");
  EXPECT_EQ(p.source(), kDraft.source);
  EXPECT_EQ(p.problem_id(), std::to_string(problem_));
  EXPECT_EQ(p.attempts(), 1);
  EXPECT_EQ(first.problems().at(p.problem_id()).source(), "# copy");
  EXPECT_DOUBLE_EQ(first.practice_lease_seconds(), 15);  // short: ServerLimits::practice_lease_s, not the 60 asked

  pb::LeaseCandidatesResponse second;
  ASSERT_TRUE(Lease(2, true, &second).ok());
  EXPECT_EQ(second.practice_calls_size(), 0);  // held
  ASSERT_EQ(second.candidates_size(), 1);
  EXPECT_EQ(second.candidates(0).candidate_id(), std::to_string(candidate));

  // A worker that does not serve practice calls never gets one.
  ASSERT_TRUE(store_->RenewLeases({p.lease_id()}, 60, Now(), /*release=*/true).ok());
  pb::LeaseCandidatesResponse plain;
  ASSERT_TRUE(Lease(2, false, &plain).ok());
  EXPECT_EQ(plain.practice_calls_size(), 0);
}

TEST_F(PracticeCallsTest, ReportPracticeStoresOnlyUnderTheLiveLease) {
  PracticeCalls calls(store_.get(), {});
  StartService(&calls);
  const int64_t call = *store_->PutPracticeCall(search_, store::PracticeTool::kProfile, kDraft.source, kDraft.plan_json);
  // A profile call needs a worker that reads counters.
  auto dead = store_->LeasePracticeCalls("dead/gpu0", 1, 5, Now() - 10, /*reads_counters=*/true);  // expired at once
  ASSERT_TRUE(dead.ok());
  ASSERT_EQ(dead->size(), 1u);
  pb::LeaseCandidatesResponse live;
  {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    pb::LeaseCandidatesRequest req;
    req.set_worker("live/gpu0");
    req.set_serves_practice(true);
    req.set_reads_counters(true);
    ASSERT_TRUE(stub_->LeaseCandidates(&ctx, req, &live).ok());
  }
  ASSERT_EQ(live.practice_calls_size(), 1);
  EXPECT_EQ(live.practice_calls(0).attempts(), 2);
  LaunchCounters l;
  l.kernel = "k";
  l.dram_pct = 42;
  const std::string report = CounterReportToJson(CounterReport{{l}, "", 0.5}).dump();
  // The dead worker's report (its lease expired and was taken over) is refused.
  grpc::Status late = Report(std::to_string(call), dead->front().lease_id, report);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << late.error_message();
  EXPECT_EQ(store_->GetPracticeCall(call)->state, store::PracticeCallState::kPending);
  // Malformed results and lease ids are refused before the store is touched.
  EXPECT_EQ(Report(std::to_string(call), live.practice_calls(0).lease_id(), "[1, 2]").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Report(std::to_string(call), "not-a-lease", report).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  {
    grpc::ClientContext ctx;  // no token
    pb::ReportPracticeRequest req;
    pb::ReportPracticeResponse resp;
    EXPECT_EQ(stub_->ReportPractice(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::Status ok = Report(std::to_string(call), live.practice_calls(0).lease_id(), report);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  auto row = store_->GetPracticeCall(call);
  EXPECT_EQ(row->state, store::PracticeCallState::kDone);
  EXPECT_DOUBLE_EQ(CounterReportFromJson(nlohmann::json::parse(row->result_json)).launches.at(0).dram_pct, 42);
  // Reported once.
  EXPECT_EQ(Report(std::to_string(call), live.practice_calls(0).lease_id(), report).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace ks::server
