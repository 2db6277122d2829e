// Tensor maps in the launch plan ("tensor_maps", evaluator/plan/tensor_map.h):
// parsing, defaults from the signature, and each rule the driver (or we) hold
// a map to, each refused with a message that names the rule.
#include "evaluator/plan/tensor_map.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "evaluator/plan/launch_plan.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// A bf16 GEMM's signature: A (M x K), B (K x N), out (M x N).
Signature GemmSig(int64_t m = 256, int64_t n = 128, int64_t k = 512) {
  Signature s;
  s.inputs = {TensorSpec{"A", false, DType::kBFloat16, {m, k}, {k, 1}},
              TensorSpec{"B", false, DType::kBFloat16, {k, n}, {n, 1}},
              TensorSpec{"alpha", true, DType::kFloat32, {}, {}, 1.0}};
  s.outputs = {TensorSpec{"out", false, DType::kFloat32, {m, n}, {n, 1}}};
  return s;
}

StatusOr<TensorMapSpec> Resolve(const json& e, const Signature& sig = GemmSig(),
                                const std::map<std::string, int64_t>& scratch = {}) {
  return ResolveTensorMap(e, sig, scratch);
}

std::string Refusal(const json& e, const Signature& sig = GemmSig()) {
  auto r = Resolve(e, sig);
  EXPECT_FALSE(r.ok()) << e.dump();
  return r.ok() ? "" : r.status().message();
}

TEST(TensorMapTest, DefaultsComeFromTheSignatureInnermostFirst) {
  auto m = Resolve({{"name", "tmA"}, {"tensor", "A"}, {"box", {64, 128}}, {"swizzle", "128B"}});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->rank, 2);
  EXPECT_EQ(m->dtype, TmaDataType::kBFloat16);
  EXPECT_EQ(m->dims[0], 512u);  // K: the contiguous dimension comes first
  EXPECT_EQ(m->dims[1], 256u);  // M
  EXPECT_EQ(m->byte_strides[0], 512u * 2);
  EXPECT_EQ(m->box[0], 64u);
  EXPECT_EQ(m->box[1], 128u);
  EXPECT_EQ(m->element_strides[0], 1u);
  EXPECT_EQ(m->swizzle, TmaSwizzle::k128B);
  EXPECT_EQ(m->interleave, TmaInterleave::kNone);
  EXPECT_EQ(m->target_bytes, 256 * 512 * 2);
  EXPECT_FALSE(m->scratch);
}

TEST(TensorMapTest, ExpressionsAndEveryOption) {
  auto m = Resolve({{"name", "tmB"},
                    {"tensor", "B"},
                    {"dtype", "bfloat16"},
                    {"dims", {"B.shape[1]", "B.shape[0] / 2"}},
                    {"byte_strides", {"B.shape[1] * 2"}},
                    {"box", {"min(64, B.shape[1])", 32}},
                    {"element_strides", {1, 2}},
                    {"interleave", "none"},
                    {"swizzle", "128B"},
                    {"l2_promotion", "256B"},
                    {"oob_fill", "nan"}});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->dims[1], 256u);
  EXPECT_EQ(m->box[0], 64u);
  EXPECT_EQ(m->element_strides[1], 2u);
  EXPECT_EQ(m->l2_promotion, TmaL2Promotion::k256B);
  EXPECT_EQ(m->oob_fill, TmaOobFill::kNan);
  EXPECT_EQ(m->swizzle, TmaSwizzle::k128B);
}

TEST(TensorMapTest, FloatTensorsMayBeReadAsTf32) {
  auto m = Resolve({{"name", "t"}, {"tensor", "out"}, {"dtype", "tfloat32"}, {"box", {32, 8}}});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->dtype, TmaDataType::kTFloat32);
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"dtype", "float32"}, {"box", {8, 8}}}),
              HasSubstr("is 4 bytes but 'A' is bfloat16"));
}

TEST(TensorMapTest, ScratchNeedsDtypeAndDims) {
  std::map<std::string, int64_t> scratch = {{"tmp", 64 * 64 * 4}};
  auto m = Resolve({{"name", "t"}, {"tensor", "tmp"}, {"dtype", "float32"}, {"dims", {64, 64}}, {"box", {32, 32}}},
                   GemmSig(), scratch);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->scratch);
  auto bad = Resolve({{"name", "t"}, {"tensor", "tmp"}, {"box", {32}}}, GemmSig(), scratch);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("give \"dtype\" and \"dims\""));
}

TEST(TensorMapTest, MalformedEntries) {
  EXPECT_THAT(Refusal({{"tensor", "A"}, {"box", {64, 64}}}), HasSubstr("needs \"name\""));
  EXPECT_THAT(Refusal({{"name", "t"}, {"box", {64, 64}}}), HasSubstr("needs \"tensor\""));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}}), HasSubstr("needs \"box\""));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "C"}, {"box", {64, 64}}}), HasSubstr("unknown tensor 'C'"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "alpha"}, {"box", {64}}}), HasSubstr("is a scalar"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {64, 64}}, {"swizle", "128B"}}),
              HasSubstr("unknown key \"swizle\""));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {64}}}), HasSubstr("\"box\" has 1 entries for a rank-2"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {64, 64}}, {"swizzle", "256B"}}),
              HasSubstr("\"swizzle\" must be one of"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {64, 64}}, {"byte_strides", {1024, 16}}}),
              HasSubstr("\"byte_strides\" has 2 entries"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"dims", {1, 2, 3, 4, 5, 6}}, {"box", {8, 1, 1, 1, 1, 1}}}),
              HasSubstr("1 to 5 dimensions"));
}

// Each rule of cuTensorMapEncodeTiled, refused before the driver sees it.
TEST(TensorMapTest, BoxLargerThan256) {
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {64, 512}}}),
              HasSubstr("box[1] = 512 is outside 1..256"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {64, 0}}}), HasSubstr("box[1] = 0 is outside 1..256"));
}

TEST(TensorMapTest, StrideNotAMultipleOf16) {
  // A (256 x 100) bf16 tensor: rows of 200 bytes.
  Signature s = GemmSig(256, 128, 100);
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {8, 8}}}, s),
              HasSubstr("byte_strides[0] = 200 is not a multiple of 16 bytes"));
}

TEST(TensorMapTest, SwizzleSpanNarrowerThanTheInnerBox) {
  // 128 bf16 = 256 bytes of inner box in a 128-byte swizzle span.
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {128, 64}}, {"swizzle", "128B"}}),
              HasSubstr("inner box (box[0] = 128 x 2 bytes = 256 bytes) is wider than the 128B swizzle span"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {32, 64}}, {"swizzle", "32B"}}),
              HasSubstr("wider than the 32B swizzle span"));
  EXPECT_TRUE(Resolve({{"name", "t"}, {"tensor", "A"}, {"box", {16, 64}}, {"swizzle", "32B"}}).ok());
}

TEST(TensorMapTest, InnerBoxNotAMultipleOf16Bytes) {
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {4, 64}}}),
              HasSubstr("(box[0] = 4 x 2 bytes = 8 bytes) is not a multiple of 16 bytes"));
}

TEST(TensorMapTest, ElementStridesAndInterleaveAndFill) {
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {8, 8}}, {"element_strides", {1, 9}}}),
              HasSubstr("an element stride is 1 to 8"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"box", {8, 8}}, {"interleave", "16B"}}),
              HasSubstr("interleaved map needs rank 3"));
  Signature s;
  s.inputs = {TensorSpec{"q", false, DType::kInt32, {4, 8, 16}, {128, 16, 1}}};
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "q"}, {"box", {8, 8, 4}}, {"oob_fill", "nan"}}, s),
              HasSubstr("\"oob_fill\": \"nan\" needs a floating-point dtype"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "q"}, {"box", {8, 8, 4}}, {"interleave", "32B"}}, s),
              HasSubstr("\"interleave\": \"32B\" needs \"swizzle\": \"32B\""));
}

// Ours: a map may not walk outside its tensor (another input set's data, the
// guard bytes after an output).
TEST(TensorMapTest, TheWalkStaysInsideItsTensor) {
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"dims", {512, 257}}, {"box", {64, 64}}}),
              HasSubstr("dims and byte_strides must stay inside the tensor"));
  EXPECT_THAT(Refusal({{"name", "t"}, {"tensor", "A"}, {"byte_strides", {2048}}, {"box", {64, 64}}}),
              HasSubstr("must stay inside the tensor"));
  // A sub-view inside the tensor is fine: the first 128 columns of every row.
  EXPECT_TRUE(Resolve({{"name", "t"}, {"tensor", "A"}, {"dims", {128, 256}}, {"box", {64, 64}}}).ok());
}

TEST(TensorMapTest, GlobalAddressNot16ByteAligned) {
  auto m = Resolve({{"name", "t"}, {"tensor", "A"}, {"box", {64, 64}}});
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(CheckTensorMapAddress(*m, 0x7f0000001000).ok());
  auto bad = CheckTensorMapAddress(*m, 0x7f0000001008);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), HasSubstr("global address of 'A' is not 16-byte aligned"));
}

TEST(TensorMapTest, JsonRoundTrip) {
  auto m = Resolve({{"name", "tmB"}, {"tensor", "B"}, {"box", {64, 32}}, {"swizzle", "128B"}, {"l2_promotion", "128B"}});
  ASSERT_TRUE(m.ok());
  auto back = TensorMapFromJson(TensorMapToJson(*m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *m);
  json broken = TensorMapToJson(*m);
  broken["swizzle"] = 9;
  EXPECT_FALSE(TensorMapFromJson(broken).ok());
}

// In a plan: the map goes to a 128-byte by-value parameter, by name.
TEST(TensorMapPlanTest, ArgumentsNameMapsAndNeedACUtensorMapParameter) {
  Signature sig = GemmSig();
  KernelInfo k;
  k.name = "gemm";
  k.params = {ParamInfo{ParamKind::kBytes, 128, 64}, ParamInfo{ParamKind::kBytes, 128, 64},
              ParamInfo{ParamKind::kB64, 8, 8}};
  json plan = {{"tensor_maps",
                {{{"name", "tmA"}, {"tensor", "A"}, {"box", {64, 128}}, {"swizzle", "128B"}},
                 {{"name", "tmB"}, {"tensor", "B"}, {"box", {64, 64}}, {"swizzle", "128B"}}}},
               {"launches", {{{"kernel", "gemm"}, {"grid", {2, 2}}, {"block", {128}}, {"args", {"tmA", "tmB", "out"}}}}}};
  auto p = ResolvePlan(plan.dump(), sig, {k}, PlanLimits());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->tensor_maps.size(), 2u);
  EXPECT_EQ(p->launches[0].args[0].kind, ArgValue::Kind::kTensorMap);
  EXPECT_EQ(p->launches[0].args[1].name, "tmB");

  json wrong = plan;
  wrong["launches"][0]["args"] = {"tmA", "out", "tmB"};
  auto r = ResolvePlan(wrong.dump(), sig, {k}, PlanLimits());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("args[1] \"out\""));

  KernelInfo ptr_kernel = k;
  ptr_kernel.params[0] = ParamInfo{ParamKind::kB64, 8, 8};
  r = ResolvePlan(plan.dump(), sig, {ptr_kernel}, PlanLimits());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("goes to a `const __grid_constant__ CUtensorMap` parameter"));

  json dup = plan;
  dup["tensor_maps"][1]["name"] = "tmA";
  r = ResolvePlan(dup.dump(), sig, {k}, PlanLimits());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("tensor_maps[1] (tmA): duplicate tensor map name"));

  json clash = plan;
  clash["tensor_maps"][0]["name"] = "out";
  r = ResolvePlan(clash.dump(), sig, {k}, PlanLimits());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("collides with a tensor"));

  json big = plan;
  big["tensor_maps"][0]["box"] = {64, 300};
  r = ResolvePlan(big.dump(), sig, {k}, PlanLimits());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("tensor_maps[0] (tmA)"));
  EXPECT_THAT(r.status().message(), HasSubstr("box[1] = 300 is outside 1..256"));
}

}  // namespace
}  // namespace ks
