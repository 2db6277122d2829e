// The judge on the GPU (issue 36): candidates are compared with the float64
// truth, with PyTorch's own error per block as the bound; exact kernels are
// never specialised, lower precisions pass only the contracts that admit them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "evaluator/compile/candidate_parser.h"
#include "tests/evaluator/gpu_test_util.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using ks::testing::EvalOne;
using ks::testing::EvaluatorFor;
using ks::testing::GpuFixture;

const RobustnessCheck* Find(const Robustness& r, const std::string& check) {
  for (const auto& c : r.checks)
    if (c.check == check) return &c;
  return nullptr;
}

void Print(const char* what, const Evaluation& e) {
  std::printf("%-40s %-10s %s\n", what, EvalStatusName(e.status),
              e.robustness ? e.robustness->Summary().c_str() : e.message.substr(0, 160).c_str());
  if (e.robustness)
    for (const auto& c : e.robustness->checks)
      std::printf("    %-11s %-11s %s\n", c.check.c_str(), c.outcome.c_str(), c.detail.substr(0, 220).c_str());
}

// Scores, softmax and the weighted sum in double: exact to float32's output.
constexpr const char* kExactAttention = R"CUDA(
extern "C" __global__ void attention_exact(const float* q, const float* k, const float* v, float* out, int n, int d) {
  const int row = blockIdx.x, b = row / n, t = threadIdx.x;
  if (t >= d) return;
  const float* qi = q + (size_t)row * d;
  const float* kb = k + (size_t)b * n * d;
  const float* vb = v + (size_t)b * n * d;
  double m = -1.0 / 0.0;
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int u = 0; u < d; ++u) s += (double)qi[u] * (double)kb[(size_t)j * d + u];
    m = s > m ? s : m;
  }
  double sum = 0, acc = 0;
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int u = 0; u < d; ++u) s += (double)qi[u] * (double)kb[(size_t)j * d + u];
    double p = exp(s - m);
    sum += p;
    acc += p * (double)vb[(size_t)j * d + t];
  }
  out[(size_t)row * d + t] = (float)(acc / sum);
}
)CUDA";

constexpr const char* kAttentionPlan = R"P({"launches": [{"kernel": "attention_exact", "grid": ["q.shape[0] * q.shape[1]"],
  "block": [32], "args": ["q", "k", "v", "out", "q.shape[1]", "q.shape[2]"]}]})P";

TEST(JudgeGpuTest, AnExactAttentionIsCorrectAndRobustWhereTheX1e5SetIsIllConditioned) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("attention_twins.py"));
  ASSERT_NE(ev, nullptr);
  Evaluation e = EvalOne(ev, kExactAttention, kAttentionPlan);
  Print("exact attention", e);
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message;
  ASSERT_TRUE(e.robustness.has_value());
  EXPECT_FALSE(e.specialised()) << e.robustness->Summary();
  const RobustnessCheck* up = Find(*e.robustness, "scale_up");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->outcome, "held") << up->detail;
  EXPECT_THAT(up->detail, HasSubstr("ill-conditioned"));
  EXPECT_THAT(e.baseline, HasSubstr("float64"));
}

// Tensor-core GEMMs through wmma (m16n16k8 TF32), one warp per 16 x 16 tile.
// SPLIT 1: 3xTF32 (hi*hi + hi*lo + lo*hi) into a fresh accumulator per
// k-step, added to the fp32 total; SPLIT 0: one TF32 product (1xTF32).
std::string TensorCoreGemm(int split) {
  return std::string("#define SPLIT ") + std::to_string(split) + R"CUDA(
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void tc_gemm(const float* A, const float* B, float* C, int n) {
  const int tile_row = blockIdx.y * 16, tile_col = blockIdx.x * 16;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> total;
  wmma::fill_fragment(total, 0.f);
  for (int k = 0; k < n; k += 8) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a_hi, a_lo;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b_hi, b_lo;
    wmma::load_matrix_sync(a_hi, A + (size_t)tile_row * n + k, n);
    wmma::load_matrix_sync(b_hi, B + (size_t)k * n + tile_col, n);
    for (int i = 0; i < a_hi.num_elements; ++i) {
      float x = a_hi.x[i], h = wmma::__float_to_tf32(x);
      a_hi.x[i] = h;
      a_lo.x[i] = wmma::__float_to_tf32(x - h);
    }
    for (int i = 0; i < b_hi.num_elements; ++i) {
      float x = b_hi.x[i], h = wmma::__float_to_tf32(x);
      b_hi.x[i] = h;
      b_lo.x[i] = wmma::__float_to_tf32(x - h);
    }
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> step;
    wmma::fill_fragment(step, 0.f);
#if SPLIT
    wmma::mma_sync(step, a_lo, b_hi, step);
    wmma::mma_sync(step, a_hi, b_lo, step);
#endif
    wmma::mma_sync(step, a_hi, b_hi, step);
    for (int i = 0; i < total.num_elements; ++i) total.x[i] += step.x[i];
  }
  wmma::store_matrix_sync(C + (size_t)tile_row * n + tile_col, total, n, wmma::mem_row_major);
}
)CUDA";
}

constexpr const char* kGemmPlan = R"P({"launches": [{"kernel": "tc_gemm", "grid": ["cdiv(A.shape[1], 16)",
  "cdiv(A.shape[0], 16)"], "block": [32], "args": ["A", "B", "out", "A.shape[0]"]}]})P";

TEST(JudgeGpuTest, A3xTf32GemmWithAFreshAccumulatorPerKStepIsRobust) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("matmul_unit.py"));
  ASSERT_NE(ev, nullptr);
  Evaluation e = EvalOne(ev, TensorCoreGemm(1), kGemmPlan);
  Print("3xTF32 GEMM (highest)", e);
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message;
  ASSERT_TRUE(e.robustness.has_value());
  EXPECT_FALSE(e.specialised()) << e.robustness->Summary();
}

TEST(JudgeGpuTest, A1xTf32GemmIsIncorrectUnderHighestAndCorrectUnderHigh) {
  KS_REQUIRE_GPU();
  GpuEvaluator* highest = EvaluatorFor(GpuFixture("matmul_unit.py"));
  GpuEvaluator* high = EvaluatorFor(GpuFixture("matmul_unit.py"), 3, 3, 60, "high");
  ASSERT_NE(highest, nullptr);
  ASSERT_NE(high, nullptr);
  Evaluation strict = EvalOne(highest, TensorCoreGemm(0), kGemmPlan);
  Print("1xTF32 GEMM (highest)", strict);
  EXPECT_EQ(strict.status, EvalStatus::kIncorrect) << strict.message;
  Evaluation tf32 = EvalOne(high, TensorCoreGemm(0), kGemmPlan);
  Print("1xTF32 GEMM (high)", tf32);
  EXPECT_EQ(tf32.status, EvalStatus::kCorrect) << tf32.message;
  EXPECT_EQ(tf32.precision, "high");
  // Both baselines were timed under the contract.
  EXPECT_THAT(tf32.baseline, HasSubstr("torch.set_float32_matmul_precision(\"high\")")) << tf32.baseline;
}

TEST(JudgeGpuTest, HalfPrecisionArithmeticIsCorrectUnderKernelBenchOnly) {
  KS_REQUIRE_GPU();
  auto half = LoadCandidateFiles(ks::testing::SourcePath("tests/adversarial/cases/15_half_precision.md"), "");
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  for (const char* contract : {"highest", "high", "medium", "kernelbench"}) {
    GpuEvaluator* ev = EvaluatorFor(GpuFixture("scale.py"), 3, 3, 60, contract);
    ASSERT_NE(ev, nullptr);
    Evaluation e = EvalOne(ev, half->source, half->plan_json);
    Print((std::string("half precision (") + contract + ")").c_str(), e);
    EXPECT_EQ(e.status, std::string(contract) == "kernelbench" ? EvalStatus::kCorrect : EvalStatus::kIncorrect)
        << contract << ": " << e.message;
    EXPECT_EQ(e.precision, contract);
    if (e.correct()) {
      ASSERT_TRUE(e.speedup_best.has_value());
      EXPECT_THAT(e.baseline, HasSubstr("faster of eager and torch.compile"));
    }
  }
}

}  // namespace
}  // namespace ks
