// Hopper's own machine in a candidate (issue 23), on a GPU of compute
// capability 9.0: candidates compile for the arch-specific target (sm_90a) and
// say so, a TMA tile copy through a plan's tensor map is correct on every input
// set (each set gets its own map), a wgmma GEMM with a TMA + mbarrier pipeline
// runs, and each bad tensor map is an invalid_plan naming its rule. Skips
// without a GPU, or on one older than 9.0.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/files.h"
#include "evaluator/plan/launch_config.h"
#include "evaluator/plan/tensor_map.h"
#include "tests/evaluator/gpu_test_util.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using ks::testing::EvalOne;
using ks::testing::EvaluatorFor;
using ks::testing::GpuFixture;

std::string Fixture(const std::string& name) {
  auto text = ReadFile(GpuFixture(name));
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

std::string Bench(const std::string& name) {
  auto text = ReadFile(ks::testing::SourcePath("bench/hopper/" + name));
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

// The tile copy's plan with its one tensor map replaced.
std::string CopyPlan(const std::string& map) {
  return R"P({"tensor_maps": [)P" + map + R"P(],
 "launches": [{"kernel": "tile_copy", "grid": ["cdiv(x.shape[1], 32)", "cdiv(x.shape[0], 64)"], "block": [256],
               "args": ["tm", "out", "x.shape[0]", "x.shape[1]"]}]})P";
}

TEST(HopperGpuTest, ATmaTileCopyIsCorrectOnEveryInputSet) {
  KS_REQUIRE_GPU();  // before the reference: it needs a GPU too
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("tma_copy.py"), /*sets=*/3);
  KS_REQUIRE_HOPPER(ev);
  // 300 x 200: the last row and column of tiles hang over the edge, where TMA fills zeros.
  Evaluation e = EvalOne(ev, Fixture("tma_tile_copy.cu"), Fixture("tma_tile_copy.json"));
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message << "\n" << e.compile_log << "\n" << e.worker_log;
  EXPECT_EQ(e.target, "sm_" + std::to_string(ev->device_info().sm_major) + std::to_string(ev->device_info().sm_minor) + "a");
  ASSERT_TRUE(e.timing.has_value());
  std::printf("tma tile copy: %.4f ms, target %s\n", e.timing->median_ms, e.target.c_str());
}

TEST(HopperGpuTest, AWgmmaGemmRunsUnderTheArchSpecificTarget) {
  KS_REQUIRE_GPU();  // before the reference: it needs a GPU too
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("gemm_bf16_small.py"), /*sets=*/2);
  KS_REQUIRE_HOPPER(ev);
  // The benchmark's own kernel (bench/hopper/): TMA, a 4-stage mbarrier
  // pipeline, setmaxnreg, wgmma m64n256k16; here at 512 x 768 x 256.
  Evaluation e = EvalOne(ev, Bench("gemm_bf16_tn.cu"), Bench("gemm_bf16_tn.json"));
  ASSERT_EQ(e.status, EvalStatus::kCorrect) << e.message << "\n" << e.compile_log << "\n" << e.worker_log;
  EXPECT_EQ(e.target, "sm_90a");
  ASSERT_FALSE(e.errors.empty());
  std::printf("wgmma gemm (small): %.4f ms, rel norm %.3g\n", e.timing->median_ms, e.errors[0].rel_norm);
}

TEST(HopperGpuTest, EachBadTensorMapIsRefusedWithItsRule) {
  KS_REQUIRE_GPU();  // before the reference: it needs a GPU too
  GpuEvaluator* ev = EvaluatorFor(GpuFixture("tma_copy.py"), /*sets=*/3);
  KS_REQUIRE_HOPPER(ev);
  const std::string source = Fixture("tma_tile_copy.cu");
  struct Case {
    std::string map;
    std::string rule;
  } cases[] = {
      {R"({"name": "tm", "tensor": "x", "box": [32, 512]})", "box[1] = 512 is outside 1..256"},
      {R"({"name": "tm", "tensor": "x", "box": [64, 64], "swizzle": "128B"})",
       "(box[0] = 64 x 4 bytes = 256 bytes) is wider than the 128B swizzle span"},
      {R"({"name": "tm", "tensor": "x", "dims": [200, 299], "byte_strides": [804], "box": [32, 64]})",
       "byte_strides[0] = 804 is not a multiple of 16"},
      {R"({"name": "tm", "tensor": "x", "dims": [200, 301], "box": [32, 64]})",
       "must stay inside the tensor"},
      {R"({"name": "tm", "tensor": "x", "box": [2, 64]})", "is not a multiple of 16 bytes"},
  };
  for (const auto& c : cases) {
    Evaluation e = EvalOne(ev, source, CopyPlan(c.map));
    EXPECT_EQ(e.status, EvalStatus::kInvalidPlan) << c.map << ": " << EvalStatusName(e.status) << " " << e.message;
    EXPECT_THAT(e.message, HasSubstr("tensor_maps[0] (tm)")) << c.map;
    EXPECT_THAT(e.message, HasSubstr(c.rule)) << c.map;
    std::printf("refused: %s\n", e.message.c_str());
  }
  // A map passed where the kernel takes a pointer.
  Evaluation e = EvalOne(ev, source, R"P({"tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 64]}],
    "launches": [{"kernel": "tile_copy", "grid": [7, 5], "block": [256], "args": ["tm", "tm", "x.shape[0]", "x.shape[1]"]}]})P");
  EXPECT_EQ(e.status, EvalStatus::kInvalidPlan);
  EXPECT_THAT(e.message, HasSubstr("goes to a `const __grid_constant__ CUtensorMap` parameter"));
  // Rows that overlap (a stride shorter than a row) stay inside the tensor, and
  // the driver accepts them (seen on the H100, driver 580): the candidate is
  // judged as any other, and reads the wrong elements.
  Evaluation overlap = EvalOne(ev, source, CopyPlan(R"({"name": "tm", "tensor": "x", "dims": [200, 300],
                                                      "byte_strides": [400], "box": [32, 64]})"));
  EXPECT_EQ(overlap.status, EvalStatus::kIncorrect) << overlap.message;
  // And the evaluator is still fine afterwards.
  Evaluation good = EvalOne(ev, source, Fixture("tma_tile_copy.json"));
  EXPECT_EQ(good.status, EvalStatus::kCorrect) << good.message;
}

// What the driver itself refuses becomes the same kind of error. No map the
// plan's rules accept was refused on the H100, so this one skips the parser:
// a box of 512 rows, sent straight to the encoder the worker uses.
TEST(HopperGpuTest, TheDriversOwnRefusalIsAnErrorThatNamesIt) {
  KS_REQUIRE_GPU();
  auto d = CudaDriver::Get();
  ASSERT_TRUE(d.ok());
  auto ctx = PrimaryContext::Open(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  auto info = QueryDevice(ctx->device());
  ASSERT_TRUE(info.ok());
  if (info->sm_major < 9) GTEST_SKIP() << "TMA needs compute capability 9.0";
  auto buf = DeviceBuffer::Alloc(300 * 200 * 4);
  ASSERT_TRUE(buf.ok());
  Signature sig;
  sig.inputs = {TensorSpec{"x", false, DType::kFloat32, {300, 200}, {200, 1}}};
  auto m = ResolveTensorMap(nlohmann::json::parse(R"({"name": "tm", "tensor": "x", "box": [32, 64]})"), sig, {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(EncodeTensorMap(**d, *m, buf->get()).ok());
  TensorMapSpec bad = *m;
  bad.box[1] = 512;  // the parser refuses this; the driver must too
  auto refused = EncodeTensorMap(**d, bad, buf->get());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("the driver refuses the map (cuTensorMapEncodeTiled: CUDA_ERROR_"));
  auto misaligned = EncodeTensorMap(**d, *m, buf->get() + 8);
  ASSERT_FALSE(misaligned.ok());
  EXPECT_THAT(misaligned.status().message(), HasSubstr("not 16-byte aligned"));
  std::printf("driver: %s\n", refused.status().message().c_str());
}

}  // namespace
}  // namespace ks
