// EvaluatorPool (search/evaluator_pool.h) on the CPU: scripted evaluators
// stand for GPUs. Candidates spread across members, results in input order and
// identical in form to one evaluator's, no member serves two chunks at once,
// a failing member is retired and its work goes to the others.
#include "search/evaluator_pool.h"

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "evaluator/evaluation.h"
#include "search/evaluator_factory.h"
#include "search/scripted_evaluator.h"

namespace ks {
namespace {

std::vector<Candidate> MakeCandidates(int n) {
  std::vector<Candidate> out;
  for (int i = 0; i < n; ++i) {
    std::string status = i % 5 == 3 ? "FAKE_STATUS(incorrect)" : "";
    out.push_back({"// k" + std::to_string(i) + " FAKE_MS(" + std::to_string(0.1 + i * 0.01) + ") " + status,
                   R"({"launches": []})"});
  }
  return out;
}

// Counts how many chunks run on it at once; a pool must keep that at 1.
class ExclusiveEvaluator final : public CandidateEvaluator {
 public:
  explicit ExclusiveEvaluator(ScriptedEvaluatorOptions o, std::atomic<int>* violations)
      : inner_(std::move(o)), violations_(violations) {}
  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& c) override {
    if (in_use_.fetch_add(1) != 0) violations_->fetch_add(1);
    auto r = inner_.EvaluateBatch(c);
    in_use_.fetch_sub(1);
    return r;
  }
  std::string DeviceName() const override { return inner_.DeviceName(); }
  int64_t evaluated() const { return inner_.evaluated(); }

 private:
  ScriptedEvaluator inner_;
  std::atomic<int>* violations_;
  std::atomic<int> in_use_{0};
};

TEST(ParseGpuList, AllListsAndErrors) {
  EXPECT_EQ(*ParseGpuList("all", 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(*ParseGpuList("2,0", 4), (std::vector<int>{2, 0}));
  EXPECT_EQ(*ParseGpuList("all", -1), (std::vector<int>{0}));
  EXPECT_EQ(*ParseGpuList("7", -1), (std::vector<int>{7}));
  EXPECT_EQ(ParseGpuList("4", 4).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseGpuList("0,0", 4).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseGpuList("0,", 4).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseGpuList("x", 4).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseGpuList("-1", 4).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseGpuList("all", 0).status().code(), Code::kFailedPrecondition);
}

TEST(EvaluatorPool, SpreadsInInputOrderIdenticalInForm) {
  ScriptedEvaluatorOptions o;
  o.delay_ms = 5;
  std::atomic<int> violations{0};
  std::vector<ExclusiveEvaluator*> raw;
  std::vector<std::unique_ptr<CandidateEvaluator>> members;
  for (int i = 0; i < 3; ++i) {
    auto m = std::make_unique<ExclusiveEvaluator>(o, &violations);
    raw.push_back(m.get());
    members.push_back(std::move(m));
  }
  EvaluatorPool pool(std::move(members));
  auto cands = MakeCandidates(40);
  auto got = pool.EvaluateBatch(cands);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ScriptedEvaluator single(o);
  auto want = single.EvaluateBatch(cands);
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < want->size(); ++i)
    EXPECT_EQ(EvaluationToJson((*got)[i]).dump(), EvaluationToJson((*want)[i]).dump()) << "candidate " << i;
  EXPECT_EQ(violations.load(), 0);
  int64_t total = 0;
  for (auto* m : raw) {
    EXPECT_GT(m->evaluated(), 0) << "every member takes part";
    total += m->evaluated();
  }
  EXPECT_EQ(total, 40) << "each candidate evaluated once";
  auto per = pool.evaluated_per_member();
  EXPECT_EQ(per[0] + per[1] + per[2], 40);
}

TEST(EvaluatorPool, ConcurrentBatchesNeverShareAMember) {
  ScriptedEvaluatorOptions o;
  o.delay_ms = 2;
  std::atomic<int> violations{0};
  std::vector<std::unique_ptr<CandidateEvaluator>> members;
  for (int i = 0; i < 2; ++i) members.push_back(std::make_unique<ExclusiveEvaluator>(o, &violations));
  EvaluatorPool pool(std::move(members));
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      auto r = pool.EvaluateBatch(MakeCandidates(10));
      if (r.ok() && r->size() == 10) ok++;
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(violations.load(), 0);
}

TEST(EvaluatorPool, FailingMemberIsRetiredAndItsWorkMoves) {
  ScriptedEvaluatorOptions good;
  good.delay_ms = 1;
  ScriptedEvaluatorOptions bad = good;
  bad.fail_after = 2;  // its GPU falls over after two candidates
  std::vector<std::unique_ptr<CandidateEvaluator>> members;
  members.push_back(std::make_unique<ScriptedEvaluator>(bad));
  members.push_back(std::make_unique<ScriptedEvaluator>(good));
  EvaluatorPool pool(std::move(members), {"gpu 0", "gpu 1"});
  auto got = pool.EvaluateBatch(MakeCandidates(30));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size(), 30u);
  EXPECT_EQ(pool.healthy(), 1u);
  // Later batches go to the healthy member only.
  auto again = pool.EvaluateBatch(MakeCandidates(5));
  ASSERT_TRUE(again.ok());
}

TEST(EvaluatorPool, EveryMemberFailingIsAnError) {
  ScriptedEvaluatorOptions bad;
  bad.fail_after = 0;
  std::vector<std::unique_ptr<CandidateEvaluator>> members;
  members.push_back(std::make_unique<ScriptedEvaluator>(bad));
  members.push_back(std::make_unique<ScriptedEvaluator>(bad));
  EvaluatorPool pool(std::move(members), {"gpu 0", "gpu 1"});
  auto got = pool.EvaluateBatch(MakeCandidates(4));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kUnavailable);
  EXPECT_NE(got.status().message().find("gpu "), std::string::npos) << got.status().ToString();
  EXPECT_TRUE(pool.EvaluateBatch({}).ok());
}

TEST(EvaluatorFactory, FakeGpusMakeAPool) {
  auto one = MakeEvaluator("problem.py", {.spec = "fake"});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(dynamic_cast<EvaluatorPool*>(one->get()), nullptr);
  auto three = MakeEvaluator("problem.py", {.spec = "fake", .gpus = "0,1,2"});
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  auto* pool = dynamic_cast<EvaluatorPool*>(three->get());
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->size(), 3u);
  auto r = (*three)->EvaluateBatch(MakeCandidates(12));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 12u);
  EXPECT_EQ(MakeEvaluator("problem.py", {.spec = "fake", .gpus = "0,0"}).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ks
