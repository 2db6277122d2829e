// The floor a candidate is judged against (evaluator/profile/roofline.h): memory and
// compute floors from a signature and measured peaks, which bound it names,
// the fastest float32-accurate path (3xTF32), and the text `eval` prints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "evaluator/profile/roofline.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TensorSpec Tensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  TensorSpec t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

// C = A @ B, n x n x n, as the bridge reports it after counting on meta.
Signature Gemm(int64_t n, DType dtype, const std::string& cls) {
  Signature s;
  s.inputs = {Tensor("A", dtype, {n, n}), Tensor("B", dtype, {n, n})};
  s.outputs = {Tensor("out", dtype, {n, n})};
  s.flops = 2.0 * n * n * n;
  s.flops_source = "counted";
  s.flops_by_class = {{cls, *s.flops}};
  return s;
}

// What an H100 measured (bridge.py peaks): cuBLAS fp32 51, TF32 495, bf16 790.
// Without an fp16 figure: the 3xTF32 path is the fastest fp32-accurate one.
DevicePeaks H100() {
  DevicePeaks p;
  p.device = "NVIDIA H100 80GB HBM3";
  p.tflops = {{"fp32", 51.0}, {"tf32", 495.0}, {"bf16", 790.0}};
  return p;
}

DevicePeaks H100WithFp16() {
  DevicePeaks p = H100();
  p.tflops["fp16"] = 780.0;
  return p;
}

// Issue 36: the floor names the fastest method each contract admits. Under
// highest a scaled 3xFP16 split is fp32-accurate at a third of the FP16 rate.
TEST(RooflineTest, TheFp32FloorFollowsThePrecisionContract) {
  const DevicePeaks peaks = H100WithFp16();
  EXPECT_EQ(FastestFp32Path(peaks, Contract::kHighest).name, "3xFP16");
  EXPECT_DOUBLE_EQ(FastestFp32Path(peaks, Contract::kHighest).tflops, 260.0);
  EXPECT_EQ(FastestFp32Path(peaks, Contract::kHigh).name, "TF32");
  EXPECT_DOUBLE_EQ(FastestFp32Path(peaks, Contract::kHigh).tflops, 495.0);
  EXPECT_EQ(FastestFp32Path(peaks, Contract::kMedium).name, "BF16");
  EXPECT_EQ(FastestFp32Path(peaks, Contract::kKernelBench).name, "BF16");  // 790 > 780
  Roofline rf = PlanRoofline(Gemm(4096, DType::kFloat32, "fp32"), 3000, &peaks, 0, Contract::kHigh);
  EXPECT_EQ(rf.fp32_path, "TF32");
  EXPECT_THAT(RooflineFloorText(rf), HasSubstr("the fastest method the precision contract admits"));
}

// A kernel above 100% of its floor is a bug in the floor. The search's
// robust 3xFP16 wgmma split ran at 143% of the 3xTF32 floor: under highest's
// floor it is below 100%, and so is every method the contract admits.
TEST(RooflineTest, NoKernelTheContractAdmitsBeatsItsFloor) {
  const DevicePeaks peaks = H100WithFp16();
  const double flops = 2.0 * 4096 * 4096 * 4096;
  const double found_tflops = 1.43 * 495.0 / 3;  // the kernel the search found
  Roofline rf = PlanRoofline(Gemm(4096, DType::kFloat32, "fp32"), 3000, &peaks, 0, Contract::kHighest);
  FinishRoofline(flops / (found_tflops * 1e12) * 1e3, &rf);
  EXPECT_LE(rf.fraction_of_floor, 1.0);
  for (Contract c : {Contract::kHighest, Contract::kHigh, Contract::kMedium, Contract::kKernelBench}) {
    Roofline r = PlanRoofline(Gemm(4096, DType::kFloat32, "fp32"), 3000, &peaks, 0, c);
    // A kernel at the peak of any method the contract admits sits at 100% at most.
    for (const char* method : {"fp32", "tf32", "bf16", "fp16"}) {
      double rate = peaks.For(method);
      if (std::string(method) == "tf32" && c == Contract::kHighest) rate /= 3;
      if (std::string(method) == "fp16" && c != Contract::kKernelBench) rate /= 3;
      if (std::string(method) == "bf16" && (c == Contract::kHighest || c == Contract::kHigh)) continue;
      Roofline at = r;
      FinishRoofline(flops / (rate * 1e12) * 1e3, &at);
      EXPECT_LE(at.fraction_of_floor, 1.0 + 1e-12) << ContractName(c) << " " << method;
    }
  }
}

TEST(RooflineTest, Fp32PathIs3xTf32WhenFaster) {
  Fp32Path p = FastestFp32Path(H100());
  EXPECT_EQ(p.name, "3xTF32");
  EXPECT_DOUBLE_EQ(p.tflops, 165.0);
  DevicePeaks slow_tf32 = H100();
  slow_tf32.tflops["tf32"] = 120;  // 40 / 3xTF32 < 51: plain fp32 is the faster path
  EXPECT_EQ(FastestFp32Path(slow_tf32).name, "fp32");
  EXPECT_DOUBLE_EQ(FastestFp32Path(slow_tf32).tflops, 51.0);
  EXPECT_DOUBLE_EQ(FastestFp32Path(DevicePeaks{}).tflops, 0.0);
}

TEST(RooflineTest, Fp32GemmIsComputeBoundAt3xTf32) {
  DevicePeaks peaks = H100();
  Roofline rf = PlanRoofline(Gemm(4096, DType::kFloat32, "fp32"), 3000, &peaks, 0);
  EXPECT_EQ(rf.bound, "compute");
  EXPECT_EQ(rf.compute_class, "fp32");
  EXPECT_EQ(rf.fp32_path, "3xTF32");
  EXPECT_DOUBLE_EQ(rf.peak_tflops, 165.0);
  const double flops = 2.0 * 4096 * 4096 * 4096;
  EXPECT_NEAR(rf.compute_floor_ms, flops / 165e12 * 1e3, 1e-9);
  EXPECT_NEAR(rf.memory_floor_ms, 3.0 * 4096 * 4096 * 4 / 3000e9 * 1e3, 1e-9);
  EXPECT_DOUBLE_EQ(rf.floor_ms, rf.compute_floor_ms);
  // The case: a kernel at 71 TFLOP/s of fp32-accurate work is below
  // its floor's rate, not 20x from it, and never above 100%.
  FinishRoofline(flops / 71e12 * 1e3, &rf);
  EXPECT_NEAR(rf.fraction_of_floor, 71.0 / 165.0, 1e-9);
  EXPECT_NEAR(rf.achieved_tflops, 71.0, 1e-9);
  std::string text = RooflineFloorText(rf);
  EXPECT_THAT(text, HasSubstr("compute-bound"));
  EXPECT_THAT(text, HasSubstr("3xTF32 (TF32 495 TFLOP/s measured / 3; fp32 matmul 51.0 TFLOP/s measured)"));
  EXPECT_THAT(text, HasSubstr("137 GFLOP counted (fp32) at 165.0 TFLOP/s"));
}

TEST(RooflineTest, Bf16GemmUsesItsOwnPeak) {
  DevicePeaks peaks = H100();
  Roofline rf = PlanRoofline(Gemm(8192, DType::kBFloat16, "bf16"), 3000, &peaks, 0);
  EXPECT_EQ(rf.bound, "compute");
  EXPECT_EQ(rf.compute_class, "bf16");
  EXPECT_EQ(rf.fp32_path, "");
  EXPECT_DOUBLE_EQ(rf.peak_tflops, 790.0);
}

TEST(RooflineTest, MixedClassesAddTheirTimes) {
  DevicePeaks peaks = H100();
  Signature s = Gemm(4096, DType::kFloat32, "fp32");
  s.flops = 3e12;
  s.flops_by_class = {{"fp32", 1e12}, {"bf16", 2e12}};
  Roofline rf = PlanRoofline(s, 3000, &peaks, 0);
  EXPECT_EQ(rf.compute_class, "mixed");
  EXPECT_NEAR(rf.compute_floor_ms, (1e12 / 165e12 + 2e12 / 790e12) * 1e3, 1e-9);
  EXPECT_NEAR(rf.peak_tflops, 3e12 / (rf.compute_floor_ms * 1e-3) / 1e12, 1e-9);
}

TEST(RooflineTest, DeclaredFlopsWithoutSplitTakeTheOutputClass) {
  DevicePeaks peaks = H100WithFp16();
  Signature s = Gemm(4096, DType::kFloat16, "fp16");
  s.flops_source = "FLOPS";
  s.flops_by_class.clear();
  Roofline rf = PlanRoofline(s, 3000, &peaks, 0);
  EXPECT_EQ(rf.compute_class, "fp16");
  EXPECT_DOUBLE_EQ(rf.peak_tflops, 780.0);
  EXPECT_THAT(RooflineFloorText(rf), HasSubstr("declared (fp16)"));
}

TEST(RooflineTest, ElementwiseProblemIsMemoryBound) {
  DevicePeaks peaks = H100();
  Signature s;
  s.inputs = {Tensor("x", DType::kFloat32, {1 << 26})};
  s.outputs = {Tensor("out", DType::kFloat32, {1 << 26})};
  s.flops = 0;
  s.flops_source = "counted";
  Roofline rf = PlanRoofline(s, 3000, &peaks, 0);
  EXPECT_EQ(rf.bound, "memory");
  EXPECT_DOUBLE_EQ(rf.compute_floor_ms, 0.0);
  EXPECT_NEAR(rf.floor_ms, 2.0 * (1 << 26) * 4 / 3000e9 * 1e3, 1e-12);
  EXPECT_THAT(RooflineFloorText(rf), HasSubstr("no matmul, convolution or attention FLOPs counted"));
}

TEST(RooflineTest, UncountedFlopsSaySoAndFloorIsMemory) {
  DevicePeaks peaks = H100();
  Signature s = Gemm(4096, DType::kFloat32, "fp32");
  s.flops.reset();
  s.flops_source.clear();
  s.flops_by_class.clear();
  s.flops_note = "FLOPs not counted: torch 1.13.0 has no torch.utils.flop_counter (it needs torch >= 2.1)";
  Roofline rf = PlanRoofline(s, 3000, &peaks, 0);
  EXPECT_EQ(rf.bound, "memory");
  std::string text = RooflineFloorText(rf);
  EXPECT_THAT(text, HasSubstr("FLOPs unknown"));
  EXPECT_THAT(text, HasSubstr("torch.utils.flop_counter"));
}

TEST(RooflineTest, NoPeaksNoComputeFloor) {
  Roofline rf = PlanRoofline(Gemm(4096, DType::kFloat32, "fp32"), 3000, nullptr, 0);
  EXPECT_EQ(rf.bound, "memory");
  EXPECT_DOUBLE_EQ(rf.peak_tflops, 0.0);
  EXPECT_THAT(RooflineFloorText(rf), HasSubstr("no measured peak"));
  // --peak-tflops replaces every class's peak.
  Roofline forced = PlanRoofline(Gemm(4096, DType::kFloat32, "fp32"), 3000, nullptr, 100);
  EXPECT_EQ(forced.bound, "compute");
  EXPECT_DOUBLE_EQ(forced.peak_tflops, 100.0);
  EXPECT_EQ(forced.fp32_path, "");
}

TEST(RooflineTest, UnmeasuredClassBoundsNothing) {
  DevicePeaks peaks = H100();
  Signature s = Gemm(1024, DType::kFloat64, "fp64");
  Roofline rf = PlanRoofline(s, 3000, &peaks, 0);
  EXPECT_DOUBLE_EQ(rf.compute_floor_ms, 0.0);
  EXPECT_EQ(rf.bound, "memory");
}

TEST(RooflineTest, JsonKeepsTheFloorsAndPeaks) {
  DevicePeaks peaks = H100();
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.roofline = PlanRoofline(Gemm(4096, DType::kFloat32, "fp32"), 3000, &peaks, 0);
  auto back = EvaluationFromJson(EvaluationToJson(e));
  ASSERT_TRUE(back.ok());
  const Roofline& r = *back->roofline;
  EXPECT_EQ(r.fp32_path, "3xTF32");
  EXPECT_EQ(r.flops_source, "counted");
  EXPECT_DOUBLE_EQ(r.peak_tf32_tflops, 495.0);
  EXPECT_DOUBLE_EQ(r.peak_fp32_tflops, 51.0);
  EXPECT_DOUBLE_EQ(r.compute_floor_ms, e.roofline->compute_floor_ms);
  EXPECT_DOUBLE_EQ(r.memory_floor_ms, e.roofline->memory_floor_ms);
}

TEST(RooflineTest, SignatureJsonKeepsTheFlopFigure) {
  Signature s = Gemm(64, DType::kFloat32, "fp32");
  s.flops_note = "no FLOP formula for foo";
  auto back = SignatureFromJson(SignatureToJson(s));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->flops_source, "counted");
  EXPECT_EQ(back->flops_note, "no FLOP formula for foo");
  EXPECT_DOUBLE_EQ(back->flops_by_class.at("fp32"), 2.0 * 64 * 64 * 64);
  // A signature written before the bridge counted: its FLOPS is declared.
  nlohmann::json old = SignatureToJson(s);
  old.erase("flops_source");
  old.erase("flops_by_class");
  EXPECT_EQ(SignatureFromJson(old)->flops_source, "FLOPS");
  // As the bridge writes a problem it could not count: nulls.
  nlohmann::json uncounted = SignatureToJson(s);
  uncounted["flops"] = nullptr;
  uncounted["flops_source"] = nullptr;
  uncounted["flops_by_class"] = nlohmann::json::object();
  auto u = SignatureFromJson(uncounted);
  ASSERT_TRUE(u.ok());
  EXPECT_FALSE(u->flops.has_value());
  EXPECT_EQ(u->flops_source, "");
  EXPECT_THAT(RooflineFloorText(Roofline{}), Not(HasSubstr("compute floor 0")));
}

}  // namespace
}  // namespace ks
