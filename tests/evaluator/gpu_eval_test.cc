// GPU evaluation end to end (issue 3): correct kernels pass with speedups,
// wrong ones fail precisely, hangs and crashes end only the worker.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include <set>

#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "common/files.h"
#include "evaluator/reference/kept_reference.h"
#include "evaluator/profile/roofline.h"
#include "tests/evaluator/gpu_test_util.h"
#include "tests/evaluator/softmax_kernel.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using ks::testing::EvalOne;
using ks::testing::EvaluatorFor;
using ks::testing::GpuFixture;
using ks::testing::kSoftmax;


std::string SoftmaxPlan(const std::string& last) {
  return std::string(R"P({"launches": [{"kernel": "softmax_rows", "grid": ["x.shape[0]"], "block": [256],
             "args": ["x", "out", "x.shape[1]", ")P") + last + R"P("]}]})P";
}

constexpr const char* kLayerNorm = R"CUDA(
extern "C" __global__ void layernorm(const float* __restrict__ x, const float* __restrict__ w,
                                     const float* __restrict__ b, float* __restrict__ out, int cols, float eps) {
  __shared__ float red[2][32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float s = 0.f, ss = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) { float v = row[i]; s += v; ss += v * v; }
  for (int o = 16; o; o >>= 1) { s += __shfl_xor_sync(0xffffffffu, s, o); ss += __shfl_xor_sync(0xffffffffu, ss, o); }
  if ((threadIdx.x & 31) == 0) { red[0][threadIdx.x >> 5] = s; red[1][threadIdx.x >> 5] = ss; }
  __syncthreads();
  s = 0.f; ss = 0.f;
  for (int i = 0; i < blockDim.x / 32; ++i) { s += red[0][i]; ss += red[1][i]; }
  float mean = s / cols;
  float rstd = rsqrtf(ss / cols - mean * mean + eps);
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    out[(size_t)blockIdx.x * cols + i] = (row[i] - mean) * rstd * w[i] + b[i];
}
)CUDA";

constexpr const char* kLayerNormPlan = R"P({"launches": [{"kernel": "layernorm", "grid": ["x.shape[0]"], "block": [256],
  "args": ["x", "ln.weight", "ln.bias", "out", "x.shape[1]", "0.00001"]}]})P";

constexpr const char* kScale = R"CUDA(
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * 2.f + 1.f;
}
)CUDA";
constexpr const char* kScalePlan = R"P({"launches": [{"kernel": "scale", "grid": ["cdiv(x.numel, 256)"], "block": [256],
  "args": ["x", "out", "x.numel"]}]})P";

TEST(GpuEvalTest, CorrectSoftmaxPassesWithSpeedups) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("softmax_small.py"));
  ASSERT_NE(ev, nullptr);
  Evaluation e = EvalOne(ev, kSoftmax, SoftmaxPlan("x.shape[1]"));
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message << e.compile_log;
  ASSERT_TRUE(e.timing.has_value());
  EXPECT_GE(e.timing->runs, 10);
  EXPECT_GT(e.timing->median_ms, 0);
  ASSERT_TRUE(e.speedup_eager.has_value());
  EXPECT_GT(*e.speedup_eager, 0);
  ASSERT_TRUE(e.roofline.has_value());
  EXPECT_GT(e.roofline->achieved_gbps, 0);
  EXPECT_EQ(e.roofline->bound, "memory");     // softmax_small declares no FLOPS
  EXPECT_EQ(e.roofline->peak_tflops, 0);
  ASSERT_EQ(e.errors.size(), 1u);
  EXPECT_LT(e.errors[0].rel_norm, 1e-5);
  // Issue 33: one launch is profiled by the timed runs themselves (no runs
  // of its own), and the result says where its runs spent their time.
  ASSERT_EQ(e.launch_profiles.size(), 1u);
  EXPECT_EQ(e.launch_profiles[0].runs, e.timing->runs);
  std::map<std::string, double> parts(e.run_parts.begin(), e.run_parts.end());
  for (const char* k : {"stage", "worker", "kernel", "compare", "inputs", "guards", "runs"})
    EXPECT_TRUE(parts.count(k)) << k;
  // Correctness, warm-up and timed runs, each counted once.
  EXPECT_GE(parts["runs"], e.timing->runs + 3 + 1);
  EXPECT_GT(parts["kernel"], 0);
  EXPECT_LT(parts["kernel"], parts["worker"]) << "the plan's time is part of the worker's round trip";
  std::printf("softmax: median %.4f ms, eager %.4f ms, speedup %.2fx, %.0f GB/s (%.0f%% of floor); bandwidth probe %.0f GB/s\n",
              e.timing->median_ms, e.eager ? e.eager->median_ms : 0, *e.speedup_eager, e.roofline->achieved_gbps,
              e.roofline->fraction_of_floor * 100, ev->measured_bandwidth_gbps());
}

constexpr const char* kMatmul = R"CUDA(
extern "C" __global__ void matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                  int n) {
  __shared__ float a[16][16], b[16][16];
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < n; k0 += 16) {
    a[threadIdx.y][threadIdx.x] = A[(size_t)row * n + k0 + threadIdx.x];
    b[threadIdx.y][threadIdx.x] = B[(size_t)(k0 + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < 16; ++k) acc += a[threadIdx.y][k] * b[k][threadIdx.x];
    __syncthreads();
  }
  C[(size_t)row * n + col] = acc;
}
)CUDA";
constexpr const char* kMatmulPlan = R"P({"launches": [{"kernel": "matmul", "grid": ["cdiv(A.shape[1], 16)",
  "cdiv(A.shape[0], 16)"], "block": [16, 16], "args": ["A", "B", "out", "A.shape[0]"]}]})P";

TEST(GpuEvalTest, AProblemWithFlopsGetsAComputeFloorFromTheMeasuredPeak) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("matmul_1024.py"));
  ASSERT_NE(ev, nullptr);
  auto peaks = ev->Peaks();
  ASSERT_TRUE(peaks.ok()) << peaks.status().ToString();
  Evaluation e = EvalOne(ev, kMatmul, kMatmulPlan);
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message;
  ASSERT_TRUE(e.roofline.has_value());
  const Roofline& r = *e.roofline;
  EXPECT_DOUBLE_EQ(r.flops, 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(r.compute_class, "fp32");
  // The fastest float32-accurate path: 3xTF32 where a third of the TF32 peak beats fp32 (the H100).
  EXPECT_DOUBLE_EQ(r.peak_tflops, ClassPeakTflops(*peaks, "fp32"));
  EXPECT_EQ(r.fp32_path, FastestFp32Path(*peaks).name);
  EXPECT_DOUBLE_EQ(r.peak_fp32_tflops, peaks->For("fp32"));
  EXPECT_DOUBLE_EQ(r.peak_tf32_tflops, peaks->For("tf32"));
  EXPECT_EQ(r.flops_source, "FLOPS");
  EXPECT_GT(r.peak_tflops, 10);  // any datacenter GPU; the H100 measures ~51
  EXPECT_DOUBLE_EQ(r.peak_gbps, ev->measured_bandwidth_gbps());
  EXPECT_EQ(r.bound, "compute");
  EXPECT_NEAR(r.floor_ms, r.flops / (r.peak_tflops * 1e12) * 1e3, 1e-9);
  EXPECT_NEAR(r.fraction_of_floor, r.floor_ms / e.timing->median_ms, 1e-9);
  EXPECT_GT(r.achieved_tflops, 0);
  EXPECT_LT(r.achieved_tflops, r.peak_tflops * 1.05);  // a naive tiled kernel does not beat cuBLAS
  std::printf("matmul 1024^3 naive tiles: %.4f ms, %.2f TFLOP/s; peak fp32 %.1f TFLOP/s (cached: %d); "
              "floor %.4f ms (%s-bound), %.0f%% of it; eager %.4f ms\n",
              e.timing->median_ms, r.achieved_tflops, r.peak_tflops, peaks->from_cache, r.floor_ms, r.bound.c_str(),
              r.fraction_of_floor * 100, e.eager ? e.eager->median_ms : 0);
}

TEST(GpuEvalTest, CorrectLayerNormPasses) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("layernorm_small.py"));
  ASSERT_NE(ev, nullptr);
  Evaluation e = EvalOne(ev, kLayerNorm, kLayerNormPlan);
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message;
  ASSERT_TRUE(e.speedup_eager.has_value());
  std::printf("layernorm: median %.4f ms, speedup vs eager %.2fx, vs compile %s\n", e.timing->median_ms,
              *e.speedup_eager, e.speedup_compile ? std::to_string(*e.speedup_compile).c_str() : "n/a");
}

TEST(GpuEvalTest, OffByOneFailsWithTheFirstMismatchIndex) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("softmax_small.py"));
  ASSERT_NE(ev, nullptr);
  Evaluation e = EvalOne(ev, kSoftmax, SoftmaxPlan("x.shape[1] - 1"));
  ASSERT_EQ(e.status, EvalStatus::kIncorrect);
  ASSERT_EQ(e.errors.size(), 1u);
  EXPECT_EQ(e.errors[0].first_mismatch, 4095);  // the last column of row 0
  EXPECT_EQ(e.errors[0].mismatches, 2048);      // one per row
  EXPECT_EQ(e.errors[0].unwritten, 2048);
  EXPECT_THAT(e.message, HasSubstr("first at index 4095"));
  EXPECT_THAT(e.message, HasSubstr("never written"));
}

TEST(GpuEvalTest, AHungKernelTimesOutAndTheNextCandidatePasses) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("scale.py"));
  ASSERT_NE(ev, nullptr);
  int restarts = ev->worker_restarts();
  const char* hang = R"CUDA(
extern "C" __global__ void scale(const float* x, float* out, long long n) {
  volatile unsigned int* flag = (volatile unsigned int*)out;
  while (flag[0] != 12345u) {}
}
)CUDA";
  auto r = ev->EvaluateBatch({Candidate{hang, kScalePlan}, Candidate{kScale, kScalePlan}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].status, EvalStatus::kTimeout) << (*r)[0].message;
  EXPECT_EQ((*r)[1].status, EvalStatus::kCorrect) << (*r)[1].message;
  EXPECT_EQ(ev->worker_restarts(), restarts + 1);
}

TEST(GpuEvalTest, AnIllegalAddressIsReportedAndTheNextCandidatePasses) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("scale.py"));
  ASSERT_NE(ev, nullptr);
  const char* wild = R"CUDA(
extern "C" __global__ void scale(const float* x, float* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i + (1ll << 40)] = x[i];
}
)CUDA";
  auto r = ev->EvaluateBatch({Candidate{wild, kScalePlan}, Candidate{kScale, kScalePlan}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].status, EvalStatus::kRuntimeError);
  EXPECT_THAT((*r)[0].message, HasSubstr("CUDA_ERROR_ILLEGAL_ADDRESS"));
  EXPECT_EQ((*r)[1].status, EvalStatus::kCorrect) << (*r)[1].message;
}

TEST(GpuEvalTest, ALaunchTheDeviceRefusesIsALaunchErrorAndTheNextPasses) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("scale.py"));
  ASSERT_NE(ev, nullptr);
  // Compiled for at most 128 threads per block, launched with 256.
  const char* bounded = R"CUDA(
extern "C" __global__ void __launch_bounds__(128) scale(const float* x, float* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * 2.f + 1.f;
}
)CUDA";
  auto r = ev->EvaluateBatch({Candidate{bounded, kScalePlan}, Candidate{kScale, kScalePlan}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].status, EvalStatus::kLaunchError) << (*r)[0].message;
  EXPECT_THAT((*r)[0].message, HasSubstr("CUDA_ERROR"));
  EXPECT_EQ((*r)[1].status, EvalStatus::kCorrect) << (*r)[1].message;
}

// Issue 12: a reference can stay on the GPU in the bridge process (CUDA IPC):
// nothing but a small manifest is written, the evaluator maps the bridge's
// tensors, a right kernel passes and a wrong one fails as with files, a second
// preparation takes its timings from the cache, and the bridge ends with the
// last user of the reference.
TEST(GpuEvalTest, AResidentReferenceIsMappedNotWritten) {
  KS_REQUIRE_GPU();
  namespace fs = std::filesystem;
  ks::testing::TempDir cache_dir("ks_resident_");
  const std::string cache = cache_dir.string();
  ReferenceOptions ro;
  ro.sets = 2;
  ro.device = "cuda";
  ro.time = true;
  ro.cache_dir = cache;
  ro.resident_min_bytes = 0;  // resident whatever the size
  pid_t bridge_pid = 0;
  {
    auto ref = PrepareReference(GpuFixture("softmax_small.py"), ro);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    ASSERT_NE(ref->resident, nullptr);
    bridge_pid = ref->resident->pid();
    EXPECT_TRUE(ref->resident->Alive());
    EXPECT_TRUE(ref->dir.empty());
    EXPECT_TRUE(ref->eager.has_value());
    uint64_t written = 0;
    for (const auto& e : fs::recursive_directory_iterator(cache))
      if (e.is_regular_file()) {
        EXPECT_NE(e.path().extension(), ".bin") << e.path();
        written += e.file_size();
      }
    EXPECT_LT(written, 64u * 1024) << "only the manifest is cached";
    GpuEvaluatorOptions go;
    go.run_timeout_s = 3;
    go.target_timed_ms = 300;
    auto ev = GpuEvaluator::Create(*ref, go);
    ASSERT_TRUE(ev.ok()) << ev.status().ToString();
    // The bridge names its GPU; on that GPU the tensors are mapped, not copied.
    EXPECT_FALSE(ref->resident->pci_bus_id().empty());
    EXPECT_TRUE(ks::SameBusId(ref->resident->pci_bus_id(), (*ev)->device_info().pci_bus_id))
        << ref->resident->pci_bus_id() << " vs " << (*ev)->device_info().pci_bus_id;
    EXPECT_FALSE((*ev)->copies_resident());
    Evaluation good = EvalOne(ev->get(), kSoftmax, SoftmaxPlan("x.shape[1]"));
    EXPECT_EQ(good.status, EvalStatus::kCorrect) << good.message;
    Evaluation bad = EvalOne(ev->get(), kSoftmax, SoftmaxPlan("x.shape[1] - 1"));
    EXPECT_EQ(bad.status, EvalStatus::kIncorrect) << bad.message;
    ASSERT_EQ(bad.errors.size(), 1u);
    EXPECT_EQ(bad.errors[0].first_mismatch, 4095);

    auto again = PrepareReference(GpuFixture("softmax_small.py"), ro);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    ASSERT_NE(again->resident, nullptr);
    bool timing_cached = false;
    for (const auto& [name, s] : again->phases) timing_cached |= name.find("from the cache") != std::string::npos;
    EXPECT_TRUE(timing_cached);
    ASSERT_TRUE(again->eager.has_value());
    EXPECT_DOUBLE_EQ(again->eager->median_ms, ref->eager->median_ms);
    std::printf("resident softmax: %.4f ms, eager %.4f ms; bridge pid %d\n", good.timing ? good.timing->median_ms : 0,
                ref->eager->median_ms, static_cast<int>(bridge_pid));
  }
  // Evaluator and references gone: the bridge has exited and been reaped.
  EXPECT_NE(kill(bridge_pid, 0), 0);
}

// Issue 33, `--keep-reference`: a resident reference started with keep_s
// stays after its command; the next preparation of the same problem leases it
// (no python started), judges the same kernels the same way from the same
// tensors, and the bridge exits once released. A refresh asks it to stop.
TEST(GpuEvalTest, AKeptReferenceIsLeasedByTheNextCommand) {
  KS_REQUIRE_GPU();
  ks::testing::TempDir cache_dir("ks_kept_");
  ReferenceOptions ro;
  ro.sets = 2;
  ro.device = "cuda";
  ro.time = true;
  ro.cache_dir = cache_dir.string();
  ro.resident_min_bytes = 0;
  ro.keep_s = 60;
  auto judge = [](const ReferenceData& ref) {
    GpuEvaluatorOptions go;
    go.run_timeout_s = 3;
    go.target_timed_ms = 100;
    auto ev = GpuEvaluator::Create(ref, go);
    EXPECT_TRUE(ev.ok()) << ev.status().ToString();
    if (!ev.ok()) return std::make_pair(EvalStatus::kRuntimeError, EvalStatus::kRuntimeError);
    Evaluation good = EvalOne(ev->get(), kSoftmax, SoftmaxPlan("x.shape[1]"));
    Evaluation bad = EvalOne(ev->get(), kSoftmax, SoftmaxPlan("x.shape[1] - 1"));
    EXPECT_EQ(good.status, EvalStatus::kCorrect) << good.message;
    return std::make_pair(good.status, bad.status);
  };
  pid_t kept_pid = 0;
  {
    auto first = PrepareReference(GpuFixture("softmax_small.py"), ro);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_NE(first->resident, nullptr);
    ASSERT_TRUE(first->resident->kept().has_value());
    const KeptInfo& k = *first->resident->kept();
    EXPECT_FALSE(k.leased);
    EXPECT_TRUE(k.declined.empty()) << k.declined;
    EXPECT_FALSE(k.socket.empty());
    EXPECT_GT(k.gpu_bytes, 0u);
    kept_pid = k.pid;
    EXPECT_EQ(first->resident->pid(), kept_pid);
    EXPECT_EQ(judge(*first), std::make_pair(EvalStatus::kCorrect, EvalStatus::kIncorrect));
  }
  // The first command is over: its bridge stays.
  ASSERT_GT(kept_pid, 0);
  EXPECT_EQ(kill(kept_pid, 0), 0) << "the kept bridge outlives its command";
  auto listed = ListKeptReferences(cache_dir.string());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].pid, kept_pid);
  EXPECT_EQ((*listed)[0].leases, 0);
  {
    const auto t0 = std::chrono::steady_clock::now();
    auto second = PrepareReference(GpuFixture("softmax_small.py"), ro);
    const double lease_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    ASSERT_NE(second->resident, nullptr);
    ASSERT_TRUE(second->resident->kept().has_value());
    EXPECT_TRUE(second->resident->kept()->leased);
    EXPECT_EQ(second->resident->pid(), kept_pid);
    ASSERT_TRUE(second->eager.has_value()) << "the timings come from the cache";
    ASSERT_FALSE(second->phases.empty());
    EXPECT_NE(second->phases[0].first.find("kept reference leased"), std::string::npos) << second->phases[0].first;
    EXPECT_LT(lease_s, 2.0) << "no python started, nothing computed";
    EXPECT_EQ(judge(*second), std::make_pair(EvalStatus::kCorrect, EvalStatus::kIncorrect));
    std::printf("kept reference: leased in %.3f s from pid %d\n", lease_s, static_cast<int>(kept_pid));
    // A third, concurrent lease while the second is open.
    auto third = PrepareReference(GpuFixture("softmax_small.py"), ro);
    ASSERT_TRUE(third.ok()) << third.status().ToString();
    EXPECT_EQ(third->resident->pid(), kept_pid);
    EXPECT_EQ((*ListKeptReferences(cache_dir.string()))[0].leases, 2);
  }
  // A refresh asks the kept bridge to stop and computes (and keeps) a new one.
  ReferenceOptions refresh = ro;
  refresh.refresh = true;
  pid_t new_pid = 0;
  {
    auto fresh = PrepareReference(GpuFixture("softmax_small.py"), refresh);
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    ASSERT_TRUE(fresh->resident->kept().has_value());
    EXPECT_FALSE(fresh->resident->kept()->leased);
    new_pid = fresh->resident->kept()->pid;
    EXPECT_NE(new_pid, kept_pid);
  }
  for (int i = 0; i < 100 && kill(kept_pid, 0) == 0; ++i) usleep(50 * 1000);
  EXPECT_NE(kill(kept_pid, 0), 0) << "the old bridge stopped";
  auto stopped = StopKeptReferences(cache_dir.string(), "softmax_small.py");
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->size(), 1u);
  for (int i = 0; i < 100 && kill(new_pid, 0) == 0; ++i) usleep(50 * 1000);
  EXPECT_NE(kill(new_pid, 0), 0) << "released: its GPU memory is free";
  EXPECT_TRUE(ListKeptReferences(cache_dir.string())->empty());
}

// Two GPUs (issue 33): the bridge keeps the reference on its GPU; an
// evaluator on the other GPU copies it into its own memory at Setup (one peer
// copy), judges the same kernels the same way, and reads nothing across GPUs.
TEST(GpuEvalTest, AnEvaluatorOnAnotherGpuCopiesAResidentReference) {
  KS_REQUIRE_GPU();
  auto d = ks::CudaDriver::Get();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  int count = 0;
  ASSERT_EQ((*d)->cuDeviceGetCount(&count), CUDA_SUCCESS);
  if (count < 2) GTEST_SKIP() << "needs two GPUs (this machine has " << count << ")";
  ks::testing::TempDir cache_dir("ks_resident2_");
  ReferenceOptions ro;
  ro.sets = 2;
  ro.device = "cuda";
  ro.cache_dir = cache_dir.string();
  ro.resident_min_bytes = 0;
  auto ref = PrepareReference(GpuFixture("softmax_small.py"), ro);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  ASSERT_NE(ref->resident, nullptr);
  std::map<int, std::pair<bool, std::vector<EvalStatus>>> seen;
  for (int device : {0, 1}) {
    GpuEvaluatorOptions go;
    go.device = device;
    go.run_timeout_s = 3;
    go.target_timed_ms = 100;
    auto ev = GpuEvaluator::Create(*ref, go);
    ASSERT_TRUE(ev.ok()) << "device " << device << ": " << ev.status().ToString();
    Evaluation good = EvalOne(ev->get(), kSoftmax, SoftmaxPlan("x.shape[1]"));
    Evaluation bad = EvalOne(ev->get(), kSoftmax, SoftmaxPlan("x.shape[1] - 1"));
    seen[device] = {(*ev)->copies_resident(), {good.status, bad.status}};
    std::printf("device %d (%s): %s the resident reference; right kernel %s, wrong one %s\n", device,
                (*ev)->device_info().pci_bus_id.c_str(), (*ev)->copies_resident() ? "copies" : "maps",
                good.message.c_str(), bad.message.c_str());
  }
  EXPECT_FALSE(seen[0].first) << "the bridge's own GPU maps its tensors";
  EXPECT_TRUE(seen[1].first) << "the other GPU copies them";
  for (int device : {0, 1}) {
    EXPECT_EQ(seen[device].second[0], EvalStatus::kCorrect) << "device " << device;
    EXPECT_EQ(seen[device].second[1], EvalStatus::kIncorrect) << "device " << device;
  }
}

TEST(GpuEvalTest, AMultiGigabyteProblemRuns) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("big_scale.py"), /*sets=*/2);
  ASSERT_NE(ev, nullptr);
  Evaluation e = EvalOne(ev, kScale, kScalePlan);
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message;
  std::printf("2 GiB scale: median %.3f ms, %.0f GB/s, speedup vs eager %.2fx\n", e.timing->median_ms,
              e.roofline->achieved_gbps, e.speedup_eager.value_or(0));
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

// Issue 17: each launch of a two-launch plan is timed on its own (in split runs
// apart from the timed ones), and the launch times add up to the plan's median;
// each kernel's occupancy comes from the driver with the resource that limits it.
TEST(GpuEvalTest, EachLaunchIsTimedOnItsOwnAndTheTimesAddUpToThePlan) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("big_scale.py"), /*sets=*/2);
  ASSERT_NE(ev, nullptr);
  auto source = ReadFile(GpuFixture("two_launch_scale.cu"));
  auto plan = ReadFile(GpuFixture("two_launch_scale.json"));
  ASSERT_TRUE(source.ok() && plan.ok());
  Evaluation e = EvalOne(ev, *source, *plan);
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message;
  ASSERT_EQ(e.launch_profiles.size(), 2u);
  double sum = 0;
  for (const auto& p : e.launch_profiles) {
    std::printf("launch %d %s: median %.4f ms over %d runs (%.0f%%), %.0f GB/s over %.0f MB; ", p.index,
                p.kernel.c_str(), p.median_ms, p.runs, 100 * p.share, p.achieved_gbps, p.bytes / 1e6);
    ASSERT_TRUE(p.occupancy.has_value()) << p.kernel;
    const Occupancy& o = *p.occupancy;
    std::printf("%d blocks/SM, %d registers, limited by %s (registers %d, shared %d, threads %d, blocks %d)\n",
                o.blocks_per_sm, o.registers, o.limiter.c_str(), o.by_registers, o.by_shared, o.by_threads,
                o.by_block_limit);
    EXPECT_GT(p.median_ms, 0);
    EXPECT_GT(p.share, 0.2) << "both launches move gigabytes";
    EXPECT_GT(p.achieved_gbps, 100);
    // 256 threads with few registers and no shared memory: 2048 / 256 = 8 blocks.
    EXPECT_EQ(o.threads_per_block, 256);
    EXPECT_EQ(o.blocks_per_sm, 8);
    EXPECT_EQ(o.by_threads, 8);
    EXPECT_EQ(o.limiter, "threads");
    EXPECT_NEAR(o.warps_fraction, 1.0, 1e-9);
    sum += p.median_ms;
  }
  EXPECT_EQ(e.launch_profiles[0].kernel, "twice");
  EXPECT_EQ(e.launch_profiles[1].kernel, "plus_one");
  EXPECT_DOUBLE_EQ(e.launch_profiles[0].bytes, 2.0 * (1 << 29) * 4);  // x and out
  EXPECT_DOUBLE_EQ(e.launch_profiles[1].bytes, 1.0 * (1 << 29) * 4);  // out
  std::printf("plan median %.4f ms, launches sum %.4f ms (%.2f%% apart)\n", e.timing->median_ms, sum,
              100 * std::abs(sum / e.timing->median_ms - 1));
  EXPECT_NEAR(sum, e.timing->median_ms, 0.05 * e.timing->median_ms);
  // What `kernelsearch eval --json` prints carries them.
  nlohmann::json j = EvaluationToJson(e);
  ASSERT_EQ(j["launch_profiles"].size(), 2u);
  EXPECT_EQ(j["launch_profiles"][1]["occupancy"]["limiter"], "threads");
}

// A cluster launch also says how many of its clusters the GPU holds at once.
TEST(GpuEvalTest, AClusterLaunchReportsClusterResidency) {
  KS_REQUIRE_GPU();
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("scale.py"));
  ASSERT_NE(ev, nullptr);
  if (ev->device_info().sm_major < 9) GTEST_SKIP() << "clusters need compute capability 9.0";
  auto source = ReadFile(GpuFixture("two_launch_scale.cu"));
  ASSERT_TRUE(source.ok());
  const char* plan = R"P({"launches": [
    {"kernel": "twice", "grid": [264], "block": [256], "args": ["x", "out", "x.numel"]},
    {"kernel": "plus_one", "grid": [264], "block": [256], "cluster": [2], "args": ["out", "x.numel"]}]})P";
  Evaluation e = EvalOne(ev, *source, plan);
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message;
  ASSERT_EQ(e.launch_profiles.size(), 2u);
  ASSERT_TRUE(e.launch_profiles[0].occupancy && e.launch_profiles[1].occupancy);
  EXPECT_EQ(e.launch_profiles[0].occupancy->cluster_size, 0);
  const Occupancy& o = *e.launch_profiles[1].occupancy;
  EXPECT_EQ(o.cluster_size, 2);
  EXPECT_GT(o.max_active_clusters, 0);
  std::printf("%s", LaunchProfileText(e.launch_profiles, "  ").c_str());

  // 16 blocks: beyond the portable 8, which the worker opts the kernel in for.
  const char* plan16 = R"P({"launches": [
    {"kernel": "twice", "grid": [256], "block": [256], "args": ["x", "out", "x.numel"]},
    {"kernel": "plus_one", "grid": [256], "block": [256], "cluster": [16], "args": ["out", "x.numel"]}]})P";
  Evaluation e16 = EvalOne(ev, *source, plan16);
  ASSERT_EQ(e16.status, EvalStatus::kCorrect) << e16.message;
  ASSERT_TRUE(e16.launch_profiles.size() == 2 && e16.launch_profiles[1].occupancy);
  EXPECT_EQ(e16.launch_profiles[1].occupancy->cluster_size, 16);
  std::printf("%s", LaunchProfileText(e16.launch_profiles, "  ").c_str());
}

// Issue 13: adaptive timing. A stable kernel stops once its median is known
// (at least min_timed_runs, far fewer than the planned 200), with the median
// the full method gives; a clearly slower candidate after it is cut short and
// says so; every phase of an evaluation is accounted for.
TEST(GpuEvalTest, AdaptiveTimingStopsWhenStableAndCutsShortAClearlySlowerCandidate) {
  KS_REQUIRE_GPU();
  ReferenceOptions ro;
  ro.sets = 2;
  ro.device = "cuda";
  ro.time = true;
  auto ref = PrepareReference(GpuFixture("softmax_small.py"), ro);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  // The same softmax, made about 4x slower by a spin before it starts.
  std::string slow = kSoftmax;
  const std::string body = "  __shared__ float red[32];\n";
  size_t at = slow.find(body);
  ASSERT_NE(at, std::string::npos);
  slow.insert(at + body.size(),
              "  { long long t0 = clock64(); while (clock64() - t0 < 200000) {} }\n");
  GpuEvaluatorOptions adaptive;
  adaptive.run_timeout_s = 5;
  auto ev = GpuEvaluator::Create(*ref, adaptive);
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  auto batch = (*ev)->EvaluateBatch({Candidate{kSoftmax, SoftmaxPlan("x.shape[1]")},
                                     Candidate{slow, SoftmaxPlan("x.shape[1]")}});
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  const Evaluation& fast = (*batch)[0];
  const Evaluation& cut = (*batch)[1];
  ASSERT_EQ(fast.status, EvalStatus::kCorrect) << fast.message;
  ASSERT_EQ(cut.status, EvalStatus::kCorrect) << cut.message;
  ASSERT_TRUE(fast.timing && cut.timing);
  EXPECT_EQ(fast.timing->stopped, "stable");
  EXPECT_GE(fast.timing->runs, adaptive.min_timed_runs);
  EXPECT_LT(fast.timing->runs, 200);
  EXPECT_FALSE(fast.timing->cut_short());
  EXPECT_EQ(cut.timing->stopped, "slower_than_best");
  EXPECT_TRUE(cut.timing->cut_short());
  EXPECT_EQ(cut.timing->runs, adaptive.cut_min_runs);
  EXPECT_GT(cut.timing->median_ms, adaptive.cut_factor * fast.timing->median_ms);
  EXPECT_DOUBLE_EQ((*ev)->best_ms(), fast.timing->median_ms);
  auto j = EvaluationToJson(cut);
  EXPECT_EQ(j["timing"]["stopped"], "slower_than_best");
  EXPECT_EQ(j["timing"]["cut_short"], true);
  // Every phase is there and together they are the evaluation's time.
  std::set<std::string> names;
  double sum = 0;
  for (const auto& [name, sec] : fast.phases) names.insert(name), sum += sec;
  for (const char* want : {"load", "correctness", "warmup", "timed", "profile", "final_checks"})
    EXPECT_TRUE(names.count(want)) << "phase " << want << " missing";
  EXPECT_NEAR(sum, fast.eval_s, 0.01 + 0.05 * fast.eval_s);

  // The full method on the same kernel: the planned count, the same median.
  GpuEvaluatorOptions full = adaptive;
  full.timing = TimingMode::kFull;
  auto ev_full = GpuEvaluator::Create(*ref, full);
  ASSERT_TRUE(ev_full.ok()) << ev_full.status().ToString();
  Evaluation f = EvalOne(ev_full->get(), kSoftmax, SoftmaxPlan("x.shape[1]"));
  ASSERT_EQ(f.status, EvalStatus::kCorrect) << f.message;
  EXPECT_EQ(f.timing->stopped, "runs");
  EXPECT_GT(f.timing->runs, fast.timing->runs);
  EXPECT_NEAR(fast.timing->median_ms, f.timing->median_ms, 0.03 * f.timing->median_ms);
  std::printf("adaptive: %.4f ms in %d runs, %.3f s (warm-up %.3f s); full: %.4f ms in %d runs, %.3f s; "
              "slow: %.4f ms, cut short after %d runs\n",
              fast.timing->median_ms, fast.timing->runs, fast.eval_s,
              [&] { for (auto& [n, s] : fast.phases) if (n == "warmup") return s; return 0.0; }(),
              f.timing->median_ms, f.timing->runs, f.eval_s, cut.timing->median_ms, cut.timing->runs);
}

}  // namespace
}  // namespace ks
