// The robustness mark and the precision contract in an evaluation (issue 27),
// without a GPU: JSON round trip, the one-line summary, --require robust.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "evaluator/evaluation.h"
#include "evaluator/signature.h"

namespace ks {
namespace {

using ::testing::HasSubstr;

Evaluation SpecialisedGemm() {
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.timing = TimingStats{1.0, 1.0, 1.0, 1.0, 0, 10};
  e.robustness = Robustness{{{"get_inputs", "held", "3 input set(s) from get_inputs()"},
                             {"scale_up", "broke", "floating-point inputs x 1e5: 1024 of 1024 elements wrong"},
                             {"scale_down", "broke", "floating-point inputs x 1e-5: relative error norm 3e-3"},
                             {"sign_flip", "held", "floating-point inputs negated"},
                             {"outliers", "not_checked", "dropped: PyTorch's output 'out' has 4 NaN/Inf elements"},
                             {"shapes", "not_checked", "the problem declares one shape"}},
                            "scale_up"};
  e.precision = "fp32";
  e.baseline = "PyTorch's defaults, which compute this problem's convolutions in TF32";
  e.eager_fp32 = TimingStats{3.0, 3.0, 3.0, 3.0, 0, 20};
  e.speedup_eager_fp32 = 3.0;
  return e;
}

TEST(RobustnessTest, TheMarkAndThePrecisionContractSurviveJson) {
  Evaluation e = SpecialisedGemm();
  nlohmann::json j = EvaluationToJson(e);
  EXPECT_TRUE(j["robustness"]["specialised"].get<bool>());
  EXPECT_EQ(j["robustness"]["broken_by"], "scale_up");
  EXPECT_EQ(j["precision"], "fp32");
  auto back = EvaluationFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->robustness.has_value());
  EXPECT_TRUE(back->specialised());
  ASSERT_EQ(back->robustness->checks.size(), 6u);
  EXPECT_EQ(back->robustness->checks[4].outcome, "not_checked");
  EXPECT_EQ(back->precision, "fp32");
  EXPECT_EQ(back->baseline, e.baseline);
  ASSERT_TRUE(back->eager_fp32.has_value());
  EXPECT_DOUBLE_EQ(back->eager_fp32->median_ms, 3.0);
  EXPECT_DOUBLE_EQ(*back->speedup_eager_fp32, 3.0);
  // An evaluation stored before any of this has none of it.
  nlohmann::json old = j;
  for (const char* k : {"robustness", "precision", "baseline", "eager_fp32", "speedup_eager_fp32"}) old.erase(k);
  auto older = EvaluationFromJson(old);
  ASSERT_TRUE(older.ok());
  EXPECT_FALSE(older->robustness.has_value());
  EXPECT_FALSE(older->specialised());
  EXPECT_TRUE(older->precision.empty());
  EXPECT_FALSE(EvaluationToJson(*older).contains("robustness"));
}

TEST(RobustnessTest, TheSummaryNamesTheFirstTransformThatBrokeIt) {
  Evaluation e = SpecialisedGemm();
  std::string s = e.robustness->Summary();
  EXPECT_THAT(s, HasSubstr("specialised"));
  EXPECT_THAT(s, HasSubstr("'scale_up' broke it (floating-point inputs x 1e5"));
  EXPECT_THAT(s, HasSubstr("not checked: outliers, shapes"));
  Robustness robust{{{"get_inputs", "held", ""}, {"scale_up", "held", ""}, {"shapes", "not_checked", ""}}, ""};
  EXPECT_FALSE(robust.specialised());
  EXPECT_EQ(robust.Summary(), "robust: held on get_inputs, scale_up; not checked: shapes");
}

TEST(RobustnessTest, RequireRobustFailsOnlyASpecialisedCorrectKernel) {
  Evaluation e = SpecialisedGemm();
  RequireRobust(e);
  EXPECT_EQ(e.status, EvalStatus::kIncorrect);
  EXPECT_THAT(e.message, HasSubstr("scale_up"));
  EXPECT_THAT(e.message, HasSubstr("--require robust"));
  EXPECT_TRUE(e.specialised());  // what broke it stays recorded

  Evaluation robust = SpecialisedGemm();
  robust.robustness->broken_by.clear();
  RequireRobust(robust);
  EXPECT_EQ(robust.status, EvalStatus::kCorrect);

  Evaluation wrong = SpecialisedGemm();
  wrong.status = EvalStatus::kIncorrect;
  wrong.message = "output 'out', input set 1: 3 of 9 elements wrong";
  RequireRobust(wrong);
  EXPECT_EQ(wrong.message, "output 'out', input set 1: 3 of 9 elements wrong");
}

TEST(RobustnessTest, ASearchWithoutTheRequirementUndoesOnlyItsMark) {
  // An evaluation reused from a search that required robust kernels.
  Evaluation e = SpecialisedGemm();
  ApplyRobustPolicy(e, true);
  ASSERT_EQ(e.status, EvalStatus::kIncorrect);
  ApplyRobustPolicy(e, false);
  EXPECT_EQ(e.status, EvalStatus::kCorrect);
  EXPECT_EQ(e.message, "");
  EXPECT_TRUE(e.specialised());
  // One wrong on its own stays wrong.
  Evaluation wrong = SpecialisedGemm();
  wrong.status = EvalStatus::kIncorrect;
  wrong.message = "output 'out', input set 1: 3 of 9 elements wrong";
  ApplyRobustPolicy(wrong, false);
  EXPECT_EQ(wrong.status, EvalStatus::kIncorrect);
}

TEST(RobustnessTest, AShiftedSetsToleranceFollowsItsScaleAndItsOwnRounding) {
  const Tolerance base = DefaultTolerance(DType::kFloat32);
  const Tolerance set0 = WidenForRounding(base, ReferenceError{1e-3, 2e-6});
  // Scaled inputs, no rounding of its own measured: set 0's, atol at the output's new scale.
  Tolerance up = ShiftedSetTolerance(set0, base, 1e5, nullptr);
  EXPECT_DOUBLE_EQ(up.atol, set0.atol * 1e5);
  EXPECT_DOUBLE_EQ(up.rel_norm, set0.rel_norm);
  EXPECT_DOUBLE_EQ(up.rtol, set0.rtol);
  // Outliers: PyTorch's own float32 error on that set is larger; the bounds widen to it.
  ReferenceError outliers{0.5, 3e-6};
  Tolerance out = ShiftedSetTolerance(set0, base, 30.0, &outliers);
  EXPECT_DOUBLE_EQ(out.atol, std::max(set0.atol * 30, base.atol * 30 + kRoundingFactor * 0.5));
  EXPECT_DOUBLE_EQ(out.rel_norm, kRoundingFactor * 3e-6);
  EXPECT_GE(out.large_rel, set0.large_rel);
  // Never narrower than set 0's (scaled): a smaller own error changes nothing.
  ReferenceError tiny{0, 1e-9};
  Tolerance same = ShiftedSetTolerance(set0, base, 2.0, &tiny);
  EXPECT_DOUBLE_EQ(same.atol, set0.atol * 2);
  EXPECT_DOUBLE_EQ(same.rel_norm, set0.rel_norm);
  // Not rounding (a relative difference above kMaxRoundingRelNorm): nothing is widened by it.
  ReferenceError wild{100, 0.5};
  EXPECT_DOUBLE_EQ(ShiftedSetTolerance(set0, base, 1.0, &wild).rel_norm, set0.rel_norm);
}

}  // namespace
}  // namespace ks
