// KernelBench constructs evaluated end to end on the GPU (issue 12, item 4):
// bool and integer inputs, an int64 output (argmax), a 0-dim output (a loss),
// a tuple of outputs, and a module in training mode whose forward changes its
// buffers. Each has a small honest kernel that must pass, and the training-mode
// problem a control that reads the post-forward state and must fail.
#include <gtest/gtest.h>

#include "evaluator/gpu_evaluator.h"
#include "tests/evaluator/gpu_test_util.h"

namespace ks {
namespace {

using ks::testing::EvalOne;
using ks::testing::EvaluatorFor;

std::string Fixture(const std::string& name) { return ks::testing::CpuFixture(name); }

// mixed_kinds.py: y = x.masked_fill(mask, 0) + labels[:, None]; outputs
// (argmax(y, 1) int64, mean(clamp(margin - 0.1 y, 0)) 0-dim, labels * 2 int32).
constexpr const char* kMixed = R"CUDA(
extern "C" __global__ void mixed(const float* x, const unsigned char* mask, const int* labels, long long* argmax,
                                 float* loss, int* twice, int rows, int cols, float margin) {
  __shared__ float partial[1024];
  int i = threadIdx.x;
  float sum = 0.f;
  if (i < rows) {
    int best = 0;
    float best_v = -INFINITY;
    for (int j = 0; j < cols; ++j) {
      float y = (mask[i * cols + j] ? 0.f : x[i * cols + j]) + (float)labels[i];
      sum += fmaxf(margin - y * 0.1f, 0.f);
      if (y > best_v) { best_v = y; best = j; }
    }
    argmax[i] = best;
    twice[i] = labels[i] * 2;
  }
  partial[i] = sum;
  __syncthreads();
  if (i == 0) {
    float total = 0.f;
    for (int k = 0; k < blockDim.x; ++k) total += partial[k];
    *loss = total / (rows * cols);
  }
}
)CUDA";
constexpr const char* kMixedPlan = R"P({"launches": [{"kernel": "mixed", "grid": [1], "block": [32],
  "args": ["x", "mask", "labels", "out0", "out1", "out2", "x.shape[0]", "x.shape[1]", 1.0]}]})P";

// stateful_buffer.py: training-mode BatchNorm1d(6) (batch statistics) times
// (calls + 1), where `calls` is the buffer's value before forward.
constexpr const char* kStateful = R"CUDA(
extern "C" __global__ void bn_train(const float* x, const float* w, const float* b, const float* calls, float* out,
                                    int n, int c, float extra) {
  int col = threadIdx.x;
  if (col >= c) return;
  float mean = 0.f, var = 0.f;
  for (int r = 0; r < n; ++r) mean += x[r * c + col];
  mean /= n;
  for (int r = 0; r < n; ++r) { float d = x[r * c + col] - mean; var += d * d; }
  var /= n;
  float scale = calls[0] + 1.f + extra;
  for (int r = 0; r < n; ++r) out[r * c + col] = ((x[r * c + col] - mean) * rsqrtf(var + 1e-5f) * w[col] + b[col]) * scale;
}
)CUDA";
std::string StatefulPlan(const char* extra) {
  return std::string(R"P({"launches": [{"kernel": "bn_train", "grid": [1], "block": [32],
    "args": ["x", "bn.weight", "bn.bias", "calls", "out", "x.shape[0]", "x.shape[1]", )P") + extra + "]}]}";
}

TEST(ConstructsGpuTest, BoolIntInputsInt64ZeroDimAndTupleOutputsPass) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(Fixture("mixed_kinds.py"));
  ASSERT_NE(ev, nullptr);
  Evaluation e = EvalOne(ev, kMixed, kMixedPlan);
  EXPECT_EQ(e.status, EvalStatus::kCorrect) << e.message;
}

TEST(ConstructsGpuTest, TrainingModeUsesThePreForwardStateForEverySet) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(Fixture("stateful_buffer.py"));
  ASSERT_NE(ev, nullptr);
  ASSERT_GE(ev->sets(), 2);
  Evaluation honest = EvalOne(ev, kStateful, StatefulPlan("0.0"));
  EXPECT_EQ(honest.status, EvalStatus::kCorrect) << honest.message;
  // As if the reference had been computed after an earlier forward (calls = 1).
  Evaluation post_forward = EvalOne(ev, kStateful, StatefulPlan("1.0"));
  EXPECT_EQ(post_forward.status, EvalStatus::kIncorrect) << post_forward.message;
}

}  // namespace
}  // namespace ks
