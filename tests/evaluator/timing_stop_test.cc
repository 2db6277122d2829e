// Issue 13: when adaptive timing stops (MedianStable), and what an evaluation
// records of it (TimingStats::stopped, phases) through its JSON.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "evaluator/evaluation.h"
#include "evaluator/gpu_evaluator_internal.h"

namespace ks {
namespace {

using gpu_internal::MedianStable;

std::vector<double> Jittered(int n, double center, double spread, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-spread, spread);
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(center * (1 + u(rng)));
  return v;
}

TEST(MedianStable, TightRunsAreStableAndScatteredOnesAreNot) {
  EXPECT_TRUE(MedianStable(Jittered(10, 1.0, 0.002, 1), 0.005, 0.001));
  EXPECT_FALSE(MedianStable(Jittered(10, 1.0, 0.05, 2), 0.005, 0.001));
  // More runs narrow the interval: +-2% jitter is not stable at 10 runs, but is at 2000.
  EXPECT_FALSE(MedianStable(Jittered(10, 1.0, 0.02, 3), 0.005, 0.001));
  EXPECT_TRUE(MedianStable(Jittered(2000, 1.0, 0.02, 3), 0.005, 0.001));
}

TEST(MedianStable, OutliersOutsideTheIntervalDoNotMatter) {
  // Two slow runs of 20 (a host hiccup) do not hold the stop back ...
  std::vector<double> v = Jittered(18, 1.0, 0.001, 4);
  v.push_back(1.5);
  v.push_back(2.0);
  EXPECT_TRUE(MedianStable(v, 0.005, 0.001));
  // ... but six of 20 do.
  std::vector<double> w = Jittered(14, 1.0, 0.001, 5);
  for (int i = 0; i < 6; ++i) w.push_back(1.5);
  EXPECT_FALSE(MedianStable(w, 0.005, 0.001));
}

TEST(MedianStable, VeryShortRunsUseTheAbsoluteFloor) {
  // 10 us runs scattered by +-0.3 us: 3% relative, within the 1 us resolution floor.
  std::vector<double> v = Jittered(10, 0.010, 0.03, 6);
  EXPECT_FALSE(MedianStable(v, 0.005, 0.0));
  EXPECT_TRUE(MedianStable(v, 0.005, 0.001));
  EXPECT_FALSE(MedianStable({1.0, 1.0}, 0.005, 0.001)) << "two runs are never enough";
}

TEST(EvaluationJson, StopReasonAndPhasesRoundTrip) {
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.timing = TimingStats{0.5, 0.5, 0.4, 0.6, 0.01, 5, "slower_than_best"};
  e.eager = TimingStats{0.3, 0.3, 0.3, 0.3, 0, 200, ""};
  e.phases = {{"load", 0.002}, {"timed", 0.010}, {"warmup", 0.025}};
  e.run_parts = {{"worker", 0.03}, {"kernel", 0.02}, {"runs", 14}};
  auto j = EvaluationToJson(e);
  EXPECT_EQ(j["timing"]["stopped"], "slower_than_best");
  EXPECT_EQ(j["timing"]["cut_short"], true);
  EXPECT_FALSE(j["eager"].contains("stopped")) << "the reference's figures carry no stop reason";
  EXPECT_DOUBLE_EQ(j["phases_s"]["warmup"].get<double>(), 0.025);
  auto back = EvaluationFromJson(j);
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(back->timing);
  EXPECT_TRUE(back->timing->cut_short());
  EXPECT_EQ(back->timing->runs, 5);
  EXPECT_EQ(back->phases.size(), 3u);
  EXPECT_DOUBLE_EQ(j["run_parts_s"]["runs"].get<double>(), 14);
  EXPECT_EQ(back->run_parts.size(), 3u);
  // An evaluation stored before these fields existed reads back without them.
  j["timing"].erase("stopped");
  j.erase("phases_s");
  j.erase("run_parts_s");
  auto old = EvaluationFromJson(j);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->timing->stopped, "");
  EXPECT_FALSE(old->timing->cut_short());
  EXPECT_TRUE(old->phases.empty());
  EXPECT_TRUE(old->run_parts.empty());
}

}  // namespace
}  // namespace ks
