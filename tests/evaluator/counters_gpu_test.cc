// Hardware counters on a GPU (label gpu): a copy kernel profiles as DRAM-bound,
// an mma kernel shows tensor-pipe use, forced shared-memory bank conflicts
// show, a candidate that misbehaves only under the profiler is still judged by
// its ordinary runs, and without ncu the evaluation goes on with a note. Also
// the compute floor of an fp32 GEMM (3xTF32) and of a counted problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "evaluator/profile/counters.h"
#include "evaluator/profile/roofline.h"
#include "tests/evaluator/gpu_test_util.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using ks::testing::EvalOne;
using ks::testing::EvaluatorFor;
using ks::testing::GpuFixture;

// The counters of one correct candidate; fails the test when they are missing.
CounterReport Profile(GpuEvaluator* ev, const std::string& source, const std::string& plan, Evaluation* e) {
  *e = EvalOne(ev, source, plan);
  EXPECT_EQ(e->status, EvalStatus::kCorrect) << e->message;
  auto reports = ev->ReadCounters({Candidate{source, plan}});
  EXPECT_EQ(reports.size(), 1u);
  if (reports.empty()) return {};
  std::printf("counters (%.1f s): %s\n%s", reports[0].seconds, reports[0].note.c_str(),
              CountersText(reports[0], "  ", 100000).c_str());
  return reports[0];
}

constexpr const char* kCopy = R"CUDA(
extern "C" __global__ void copy4(const float4* __restrict__ x, float4* __restrict__ out, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
    out[i] = x[i];
}
)CUDA";
constexpr const char* kCopyPlan = R"P({"launches": [{"kernel": "copy4", "grid": ["min(cdiv(x.numel / 4, 256), 132 * 16)"],
  "block": [256], "args": ["x", "out", "x.numel / 4"]}]})P";

TEST(CountersGpuTest, ACopyKernelIsDramBound) {
  KS_REQUIRE_GPU();
  KS_REQUIRE_NCU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("copy_large.py"), /*sets=*/2);
  ASSERT_NE(ev, nullptr);
  Evaluation e;
  CounterReport r = Profile(ev, kCopy, kCopyPlan, &e);
  ASSERT_EQ(r.launches.size(), 1u) << r.note;
  const LaunchCounters& c = r.launches[0];
  EXPECT_EQ(c.kernel, "copy4");
  EXPECT_GT(c.dram_pct, 70) << CountersDigest(c);
  EXPECT_GT(c.dram_gbps, 1000);
  EXPECT_GT(c.duration_ms, 0);
  EXPECT_LT(c.tensor_pct, 1);
  EXPECT_FALSE(c.stalls.empty());
  // The roofline of a copy: memory-bound, no FLOPs counted.
  ASSERT_TRUE(e.roofline.has_value());
  EXPECT_EQ(e.roofline->bound, "memory");
}

constexpr const char* kWmma = R"CUDA(
#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;
// One warp per 16x16 tile of C, fp32 accumulation on the tensor cores.
extern "C" __global__ void wmma_gemm(const __half* A, const __half* B, __half* C, int n) {
  const int tm = blockIdx.y, tn = blockIdx.x;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 0.f);
  for (int k = 0; k < n; k += 16) {
    wmma::load_matrix_sync(a, A + (size_t)tm * 16 * n + k, n);
    wmma::load_matrix_sync(b, B + (size_t)k * n + tn * 16, n);
    wmma::mma_sync(c, a, b, c);
  }
  __shared__ float tile[256];
  wmma::store_matrix_sync(tile, c, 16, wmma::mem_row_major);
  __syncwarp();
  for (int i = threadIdx.x; i < 256; i += 32)
    C[(size_t)(tm * 16 + i / 16) * n + tn * 16 + i % 16] = __float2half(tile[i]);
}
)CUDA";
constexpr const char* kWmmaPlan = R"P({"launches": [{"kernel": "wmma_gemm", "grid": ["cdiv(A.shape[1], 16)",
  "cdiv(A.shape[0], 16)"], "block": [32], "args": ["A", "B", "out", "A.shape[0]"]}]})P";

TEST(CountersGpuTest, AnMmaKernelUsesTheTensorPipe) {
  KS_REQUIRE_GPU();
  KS_REQUIRE_NCU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("matmul_fp16_1024.py"));
  ASSERT_NE(ev, nullptr);
  Evaluation e;
  CounterReport r = Profile(ev, kWmma, kWmmaPlan, &e);
  ASSERT_EQ(r.launches.size(), 1u) << r.note;
  EXPECT_GT(r.launches[0].tensor_pct, 1) << CountersDigest(r.launches[0]);
  // Counted on the meta device (no FLOPS in the file): 2 n^3, fp16, compute floor from the fp16 peak.
  ASSERT_TRUE(e.roofline.has_value());
  EXPECT_EQ(e.roofline->flops_source, "counted") << e.roofline->flops_note;
  EXPECT_DOUBLE_EQ(e.roofline->flops, 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(e.roofline->compute_class, "fp16");
  std::printf("wmma fp16 1024^3: %s\n", RooflineFloorText(*e.roofline).c_str());
}

// Every warp's 32 threads store to and load from one bank (a stride of 32
// words), against the same kernel with a stride of one word.
constexpr const char* kBanks = R"CUDA(
template <int STRIDE>
__device__ void through_shared(const float* x, float* out, long long n) {
  __shared__ float s[256 * STRIDE];
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    s[threadIdx.x * STRIDE] = x[i] * 2.f + 1.f;
    __syncthreads();
    out[i] = s[threadIdx.x * STRIDE];
    __syncthreads();
  }
}
extern "C" __global__ void conflicted(const float* x, float* out, long long n) { through_shared<32>(x, out, n); }
extern "C" __global__ void conflict_free(const float* x, float* out, long long n) { through_shared<1>(x, out, n); }
)CUDA";

TEST(CountersGpuTest, ForcedBankConflictsShow) {
  KS_REQUIRE_GPU();
  KS_REQUIRE_NCU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("scale.py"));
  ASSERT_NE(ev, nullptr);
  auto plan = [](const char* k) {
    return std::string(R"P({"launches": [{"kernel": ")P") + k +
           R"P(", "grid": ["cdiv(x.numel, 256)"], "block": [256], "args": ["x", "out", "x.numel"]}]})P";
  };
  Evaluation e;
  CounterReport bad = Profile(ev, kBanks, plan("conflicted"), &e);
  CounterReport good = Profile(ev, kBanks, plan("conflict_free"), &e);
  ASSERT_EQ(bad.launches.size(), 1u) << bad.note;
  ASSERT_EQ(good.launches.size(), 1u) << good.note;
  // 2^20 elements, a store and a load each, 31 extra wavefronts per warp access.
  EXPECT_GT(bad.launches[0].shared_bank_conflicts, 1e6) << CountersDigest(bad.launches[0]);
  EXPECT_LT(good.launches[0].shared_bank_conflicts, bad.launches[0].shared_bank_conflicts / 10);
}

// Stamps the global timer in its first launch and reads it in its second: two
// back-to-back launches are microseconds apart, but under ncu's replay passes
// milliseconds. Then it writes zeros: a kernel that detects the profiler.
constexpr const char* kProfilerAware = R"CUDA(
__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
extern "C" __global__ void twice(unsigned long long* stamp, const float* x, float* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = x[i] * 2.f;
  if (blockIdx.x == 0 && threadIdx.x == 0) *stamp = now_ns();
}
extern "C" __global__ void plus_one(const unsigned long long* stamp, float* out, long long n) {
  const bool watched = now_ns() - *stamp > 1000000ull;  // 1 ms between two launches of microseconds
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = watched ? 0.f : out[i] + 1.f;
}
)CUDA";
constexpr const char* kProfilerAwarePlan = R"P({"launches": [
  {"kernel": "twice", "grid": ["cdiv(x.numel, 256)"], "block": [256], "args": ["stamp", "x", "out", "x.numel"]},
  {"kernel": "plus_one", "grid": ["cdiv(x.numel, 256)"], "block": [256], "args": ["stamp", "out", "x.numel"]}],
  "scratch": [{"name": "stamp", "bytes": "8"}]})P";

TEST(CountersGpuTest, ACandidateThatMisbehavesOnlyUnderTheProfilerIsJudgedByItsOrdinaryRuns) {
  KS_REQUIRE_GPU();
  KS_REQUIRE_NCU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("scale.py"));
  ASSERT_NE(ev, nullptr);
  Evaluation e = EvalOne(ev, kProfilerAware, kProfilerAwarePlan);
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message;  // its ordinary runs are right
  auto reports = ev->ReadCounters({Candidate{kProfilerAware, kProfilerAwarePlan}});
  ASSERT_EQ(reports.size(), 1u);
  std::printf("profiler-aware candidate: %s\n", reports[0].note.c_str());
  EXPECT_TRUE(reports[0].launches.empty());
  EXPECT_THAT(reports[0].note, HasSubstr("the profiled run was not correct"));
  EXPECT_THAT(reports[0].note, HasSubstr("judged by its ordinary runs"));
  // The evaluator goes on: the next candidate is evaluated and profiled as usual.
  Evaluation next;
  CounterReport r = Profile(ev, kBanks,
                            R"P({"launches": [{"kernel": "conflict_free", "grid": ["cdiv(x.numel, 256)"], "block": [256],
                               "args": ["x", "out", "x.numel"]}]})P",
                            &next);
  EXPECT_EQ(r.launches.size(), 1u) << r.note;
}

TEST(CountersGpuTest, WithoutNcuTheEvaluationGoesOnWithANote) {
  KS_REQUIRE_GPU();
  // A fresh evaluator: the one above has found its ncu already.
  ReferenceOptions ro;
  ro.sets = 2;
  ro.device = "cuda";
  auto ref = PrepareReference(GpuFixture("scale.py"), ro);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  auto ev = GpuEvaluator::Create(*ref, GpuEvaluatorOptions{});
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  setenv("KS_NCU", "none", 1);
  Evaluation e = EvalOne(ev->get(), kCopy, R"P({"launches": [{"kernel": "copy4", "grid": ["cdiv(x.numel / 4, 256)"],
      "block": [256], "args": ["x", "out", "x.numel / 4"]}]})P");
  auto reports = (*ev)->ReadCounters({Candidate{kBanks, R"P({"launches": [{"kernel": "conflicted",
      "grid": ["cdiv(x.numel, 256)"], "block": [256], "args": ["x", "out", "x.numel"]}]})P"}});
  unsetenv("KS_NCU");
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].launches.empty());
  EXPECT_THAT(reports[0].note, HasSubstr("turned off"));
  // scale.py is x * 2 + 1: a plain copy is incorrect, and is still evaluated normally.
  EXPECT_EQ(e.status, EvalStatus::kIncorrect);
}

}  // namespace
}  // namespace ks
