// ContinueSearch (issue 32): a finished search given more rounds over the API,
// through the real service on an in-process gRPC channel. Authenticated,
// bounded like a new search's shape, only for a search that ran out of rounds,
// and handed to the job manager's resume path (ServiceDeps::queue_search, a
// recording fake here); a search the queue refuses is left finished.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "proto/kernelsearch.grpc.pb.h"
#include "search/search_config.h"
#include "search/search_setup.h"
#include "server/auth.h"
#include "server/job_manager.h"
#include "server/search_runner.h"
#include "server/service.h"
#include "server/watch_hub.h"
#include "store/lineage_store.h"
#include "tests/server/service_fixture.h"

namespace ks::server {
namespace {

namespace pb = ::kernelsearch::v1;
using ::testing::HasSubstr;
using store::SearchStatus;

class ContinueSearchTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (HasFatalFailure()) return;
    store::ProblemRow p;
    p.name = "copy";
    p.file_path = "submitted:copy.py";
    p.source = "class Model: pass\n";
    p.signature_json = "{}";
    auto pid = store_->PutProblem(p);
    ASSERT_TRUE(pid.ok()) << pid.status().ToString();
    problem_id_ = *pid;
    StartService([this](ServiceDeps& deps) {
      deps.queue_search = [this](int64_t id) -> Status {
        if (!queue_answer_.ok()) return queue_answer_;
        queued_.push_back(id);
        return Status::Ok();
      };
    });
  }

  // A search in the store as a server job leaves it: `status` with `reason`.
  int64_t Search(int rounds, SearchStatus status, const std::string& reason) {
    SearchConfig c;
    c.rounds = rounds;
    c.ideas = 2;
    c.branches = 2;
    c.beam = 2;
    c.budget_calls = 100;
    c.model = "fake";
    auto id = store_->CreateSearch(problem_id_, SearchConfigToJson(c).dump());
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    EXPECT_TRUE(store_->SetSearchStatus(*id, status, reason).ok());
    return *id;
  }

  grpc::Status Continue(const std::string& id, int rounds, pb::SearchInfo* info, bool with_token = true) {
    grpc::ClientContext ctx;
    Authorize(&ctx, with_token);
    pb::ContinueSearchRequest req;
    req.set_search_id(id);
    req.set_rounds(rounds);
    return stub_->ContinueSearch(&ctx, req, info);
  }
  grpc::Status Continue(int64_t id, int rounds, pb::SearchInfo* info) { return Continue(std::to_string(id), rounds, info); }

  int StoredRounds(int64_t id) {
    auto row = store_->GetSearch(id);
    EXPECT_TRUE(row.ok());
    auto c = SearchConfigFromJson(nlohmann::json::parse(row->config_json));
    EXPECT_TRUE(c.ok());
    return c.ok() ? c->rounds : -1;
  }
  SearchStatus StoredStatus(int64_t id) { return store_->GetSearch(id)->status; }

  int64_t problem_id_ = 0;
  std::vector<int64_t> queued_;
  Status queue_answer_ = Status::Ok();
};

TEST_F(ContinueSearchTest, AFinishedSearchGetsItsNewTotalAndIsQueued) {
  int64_t id = Search(3, SearchStatus::kFinished, kStopRounds);
  pb::SearchInfo info;
  grpc::Status st = Continue(id, 5, &info);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(queued_, std::vector<int64_t>{id});
  EXPECT_EQ(info.search_id(), std::to_string(id));
  EXPECT_EQ(info.state(), pb::QUEUED);
  EXPECT_EQ(info.config().rounds(), 5);
  EXPECT_EQ(StoredRounds(id), 5);
  EXPECT_EQ(StoredStatus(id), SearchStatus::kPending);  // a restarted server resumes it too

  // Queued now, not finished: a second call is refused and queues nothing.
  st = Continue(id, 7, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("is pending: only a finished search is continued"));
  EXPECT_EQ(queued_.size(), 1u);
  EXPECT_EQ(StoredRounds(id), 5);
}

TEST_F(ContinueSearchTest, NeedsTheToken) {
  int64_t id = Search(3, SearchStatus::kFinished, kStopRounds);
  pb::SearchInfo info;
  grpc::Status st = Continue(std::to_string(id), 5, &info, /*with_token=*/false);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(queued_.empty());
  EXPECT_EQ(StoredRounds(id), 3);
}

TEST_F(ContinueSearchTest, RoundsAreTheNewTotalAndBoundedLikeANewSearch) {
  int64_t id = Search(3, SearchStatus::kFinished, kStopRounds);
  pb::SearchInfo info;
  grpc::Status st = Continue(id, 3, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("ran its 3 rounds already; the rounds given are the new total"));
  st = Continue(id, 0, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("new total of rounds"));
  st = Continue(id, ConfigBounds().max_rounds + 1, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("rounds"));
  // 2 x 2 x 2 candidates a round: 5000 planned at most is 624 rounds, but
  // max_rounds (50) comes first; with a wider shape the plan bound holds.
  SearchConfig wide;
  wide.rounds = 3;
  wide.ideas = 16;
  wide.branches = 16;
  wide.beam = 8;
  wide.budget_calls = 100;
  auto wide_id = store_->CreateSearch(problem_id_, SearchConfigToJson(wide).dump());
  ASSERT_TRUE(wide_id.ok());
  ASSERT_TRUE(store_->SetSearchStatus(*wide_id, SearchStatus::kFinished, kStopRounds).ok());
  st = Continue(*wide_id, 4, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("more than the server allows"));
  EXPECT_TRUE(queued_.empty());
  EXPECT_EQ(StoredRounds(id), 3);
  EXPECT_EQ(StoredStatus(id), SearchStatus::kFinished);
}

TEST_F(ContinueSearchTest, OnlyASearchThatRanOutOfRounds) {
  pb::SearchInfo info;
  int64_t spent = Search(3, SearchStatus::kFinished, "budget: 100 model calls");
  grpc::Status st = Continue(spent, 5, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("finished: budget: 100 model calls; more rounds would stop at once"));
  for (SearchStatus s : {SearchStatus::kPending, SearchStatus::kRunning, SearchStatus::kCancelled,
                         SearchStatus::kFailed}) {
    int64_t id = Search(3, s, "");
    st = Continue(id, 5, &info);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << store::SearchStatusName(s);
    EXPECT_EQ(StoredRounds(id), 3);
  }
  st = Continue("999", 5, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  st = Continue("abc", 5, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(queued_.empty());
}

TEST_F(ContinueSearchTest, ASearchTheQueueRefusesStaysFinished) {
  int64_t id = Search(3, SearchStatus::kFinished, kStopRounds);
  queue_answer_ = ResourceExhausted("the search queue is full (4 waiting); try again later");
  pb::SearchInfo info;
  grpc::Status st = Continue(id, 5, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("queue is full"));
  EXPECT_EQ(StoredRounds(id), 3);
  EXPECT_EQ(StoredStatus(id), SearchStatus::kFinished);
  EXPECT_EQ(store_->GetSearch(id)->stop_reason, kStopRounds);

  queue_answer_ = Status::Ok();  // later, with room
  st = Continue(id, 5, &info);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(queued_, std::vector<int64_t>{id});
}

}  // namespace
}  // namespace ks::server
