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

// Issue 33's rule: runs of 1 ms or more need 5 timed runs before the
// stable-median test may stop them; shorter runs keep 10.
TEST(TimingStopRule, LongRunsMayStopAfterFiveShortOnesAfterTen) {
  using gpu_internal::MinTimedRuns;
  using gpu_internal::TimingStable;
  EXPECT_EQ(MinTimedRuns(9.0, 10, 5, 1.0), 5);
  EXPECT_EQ(MinTimedRuns(1.0, 10, 5, 1.0), 5);
  EXPECT_EQ(MinTimedRuns(0.02, 10, 5, 1.0), 10);
  EXPECT_EQ(MinTimedRuns(9.0, 3, 5, 1.0), 3) << "never more than the general minimum";
  // A 9 ms kernel whose five runs lie within +-0.2%: stable, stops at 5.
  std::vector<double> tight = Jittered(5, 9.0, 0.002, 7);
  EXPECT_TRUE(TimingStable(tight, tight, MinTimedRuns(9.0, 10, 5, 1.0), 0.005, 0.001));
  // Four are not enough, whatever they say.
  std::vector<double> four(tight.begin(), tight.begin() + 4);
  EXPECT_FALSE(TimingStable(four, four, 5, 0.005, 0.001));
  // Five runs spread over +-3% are not stable: with five runs the interval is
  // the whole range, so all of them must lie within the 1% band.
  std::vector<double> loose = Jittered(5, 9.0, 0.03, 8);
  EXPECT_FALSE(TimingStable(loose, loose, 5, 0.005, 0.001));
  // One slow run of five (a hiccup) holds the stop back; the rule runs on.
  std::vector<double> hiccup = {9.0, 9.01, 9.0, 9.02, 9.9};
  EXPECT_FALSE(TimingStable(hiccup, hiccup, 5, 0.005, 0.001));
  // The device-wide series must be stable too.
  EXPECT_FALSE(TimingStable(tight, loose, 5, 0.005, 0.001));
  // A 20 us kernel's five tight runs do not stop it: its minimum is 10.
  std::vector<double> micro = Jittered(5, 0.02, 0.001, 9);
  EXPECT_FALSE(TimingStable(micro, micro, MinTimedRuns(0.02, 10, 5, 1.0), 0.005, 0.001));
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


// Issue 33: the correctness runs just made count toward the warm-up (3 runs
// and 25 ms in all), with at least one warm-up run on the timing set.
TEST(TimingStopRule, TheCorrectnessRunsCountTowardTheWarmUp) {
  using gpu_internal::WarmUpRuns;
  EXPECT_EQ(WarmUpRuns({9.0, 9.0}, 9.0, 25), 1) << "two 9 ms runs made: one more warms the timing set";
  EXPECT_EQ(WarmUpRuns({30.0}, 30.0, 25), 2) << "three runs in all";
  EXPECT_EQ(WarmUpRuns({30.0, 30.0, 30.0}, 30.0, 25), 1) << "never none";
  EXPECT_EQ(WarmUpRuns({0.02, 0.02}, 0.02, 25), 1000) << "short runs: the cap, as before";
  EXPECT_EQ(WarmUpRuns({1.0, 1.0}, 1.0, 25), 23);
  EXPECT_EQ(WarmUpRuns({}, 9.0, 25), 3) << "no correctness runs counted: timing.py's rule";
  EXPECT_EQ(WarmUpRuns({}, 5.0, 25), 5);
}

}  // namespace
}  // namespace ks
