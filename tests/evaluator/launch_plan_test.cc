#include "evaluator/plan/launch_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ks {
namespace {

using ::testing::HasSubstr;

Signature LayerNormSig() {
  Signature s;
  TensorSpec x{"x", false, DType::kFloat32, {64, 4096}, {4096, 1}};
  TensorSpec w{"ln.weight", false, DType::kFloat32, {4096}, {1}};
  TensorSpec b{"ln.bias", false, DType::kFloat32, {4096}, {1}};
  TensorSpec eps{"eps", true, DType::kFloat32, {}, {}, 1e-5};
  TensorSpec dim{"dim", true, DType::kInt64, {}, {}, 1};
  TensorSpec out{"out", false, DType::kFloat32, {64, 4096}, {4096, 1}};
  s.inputs = {x, eps, dim};
  s.parameters = {w, b};
  s.outputs = {out};
  return s;
}

TEST(ExprTest, ArithmeticAndFunctions) {
  Signature s = LayerNormSig();
  EXPECT_EQ(*EvalIntExpr("1 + 2 * 3", s), 7);
  EXPECT_EQ(*EvalIntExpr("(1 + 2) * 3", s), 9);
  EXPECT_EQ(*EvalIntExpr("-7 / 2", s), -3);
  EXPECT_EQ(*EvalIntExpr("7 % 4", s), 3);
  EXPECT_EQ(*EvalIntExpr("cdiv(10, 3)", s), 4);
  EXPECT_EQ(*EvalIntExpr("cdiv(9, 3)", s), 3);
  EXPECT_EQ(*EvalIntExpr("min(5, 2, 9)", s), 2);
  EXPECT_EQ(*EvalIntExpr("max(5, 2, 9)", s), 9);
}

TEST(ExprTest, TensorShapesNumelAndScalars) {
  Signature s = LayerNormSig();
  EXPECT_EQ(*EvalIntExpr("x.shape[0]", s), 64);
  EXPECT_EQ(*EvalIntExpr("x.shape[-1]", s), 4096);
  EXPECT_EQ(*EvalIntExpr("x.numel", s), 64 * 4096);
  EXPECT_EQ(*EvalIntExpr("ln.weight.shape[0] * 2", s), 8192);
  EXPECT_EQ(*EvalIntExpr("cdiv(x.numel, 1024)", s), 256);
  EXPECT_EQ(*EvalIntExpr("dim + 1", s), 2);
}

TEST(ExprTest, ErrorsSayWhatIsWrong) {
  Signature s = LayerNormSig();
  EXPECT_THAT(EvalIntExpr("x.shape[2]", s).status().message(), HasSubstr("out of range"));
  EXPECT_THAT(EvalIntExpr("y.numel", s).status().message(), HasSubstr("unknown tensor 'y'"));
  EXPECT_THAT(EvalIntExpr("4 / 0", s).status().message(), HasSubstr("division by zero"));
  EXPECT_THAT(EvalIntExpr("9223372036854775807 + 1", s).status().message(), HasSubstr("overflow"));
  EXPECT_THAT(EvalIntExpr("(1 + 2", s).status().message(), HasSubstr("expected ')'"));
  EXPECT_THAT(EvalIntExpr("x", s).status().message(), HasSubstr("is a tensor"));
  EXPECT_THAT(EvalIntExpr("eps * 2", s).status().message(), HasSubstr("is a float"));
  EXPECT_THAT(EvalIntExpr("1.5", s).status().message(), HasSubstr("float literal"));
  EXPECT_THAT(EvalIntExpr("foo(3)", s).status().message(), HasSubstr("unknown name 'foo'"));
  EXPECT_THAT(EvalIntExpr("2 $ 3", s).status().message(), HasSubstr("unexpected '$'"));
}

std::vector<KernelInfo> Kernels() {
  KernelInfo stats{"row_stats", {{ParamKind::kB64, 8, 8}, {ParamKind::kB64, 8, 8}, {ParamKind::kB32, 4, 4}, {ParamKind::kB32, 4, 4}}, {}};
  stats.resources.static_shared_bytes = 1024;
  KernelInfo norm{"normalize",
                  {{ParamKind::kB64, 8, 8}, {ParamKind::kB64, 8, 8}, {ParamKind::kB64, 8, 8}, {ParamKind::kB64, 8, 8},
                   {ParamKind::kB64, 8, 8}, {ParamKind::kB64, 8, 8}, {ParamKind::kF32, 4, 4}},
                  {}};
  return {stats, norm};
}

constexpr const char* kGoodPlan = R"PLAN({
  "launches": [
    {"kernel": "row_stats", "grid": ["cdiv(x.shape[1], 4096)", "x.shape[0]"], "block": [256], "shared_bytes": "0",
     "args": ["x", "partial", "x.shape[0]", "x.shape[1]"]},
    {"kernel": "normalize", "grid": ["cdiv(x.numel, 1024)"], "block": [256],
     "args": ["x", "partial", "ln.weight", "ln.bias", "out", "x.numel", "eps"]}
  ],
  "scratch": [{"name": "partial", "bytes": "x.shape[0] * cdiv(x.shape[1], 4096) * 8"}]
})PLAN";

TEST(PlanTest, ResolvesTheDesignExample) {
  auto p = ResolvePlan(kGoodPlan, LayerNormSig(), Kernels(), {});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->launches.size(), 2u);
  EXPECT_EQ(p->launches[0].grid[0], 1);
  EXPECT_EQ(p->launches[0].grid[1], 64);
  EXPECT_EQ(p->launches[0].block[0], 256);
  EXPECT_EQ(p->launches[0].args[0].kind, ArgValue::Kind::kTensor);
  EXPECT_EQ(p->launches[0].args[1].kind, ArgValue::Kind::kScratch);
  EXPECT_EQ(p->launches[0].args[2].kind, ArgValue::Kind::kInt32);
  EXPECT_EQ(p->launches[0].args[2].i, 64);
  EXPECT_EQ(p->launches[1].grid[0], 256);
  EXPECT_EQ(p->launches[1].args[5].i, 64 * 4096);
  EXPECT_EQ(p->launches[1].args[5].kind, ArgValue::Kind::kInt64);  // a 64-bit parameter gets a 64-bit value
  EXPECT_EQ(p->launches[1].args[6].kind, ArgValue::Kind::kFloat32);
  EXPECT_FLOAT_EQ(p->launches[1].args[6].f, 1e-5);
  ASSERT_EQ(p->scratch.size(), 1u);
  EXPECT_EQ(p->scratch[0].bytes, 64 * 8);
}

std::string PlanError(const std::string& plan) {
  auto p = ResolvePlan(plan, LayerNormSig(), Kernels(), {});
  EXPECT_FALSE(p.ok()) << plan;
  return p.ok() ? "" : p.status().message();
}

std::string OneLaunch(const std::string& kernel_fields) {
  return R"({"launches": [{"kernel": "row_stats", )" + kernel_fields + "}]}";
}

TEST(PlanTest, BadPlansGetPreciseMessages) {
  EXPECT_THAT(PlanError("{"), HasSubstr("not valid JSON"));
  EXPECT_THAT(PlanError("[]"), HasSubstr("JSON object"));
  EXPECT_THAT(PlanError(R"({"launches": []})"), HasSubstr("non-empty"));
  EXPECT_THAT(PlanError(R"({"launches": [{"kernel": "nope", "grid": [1], "block": [1]}]})"),
              HasSubstr("launches[0] (nope): no extern \"C\" __global__ kernel of that name; the source has: row_stats, normalize"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [2048], "args": ["x", "x", 1, 1])")),
              HasSubstr("block.x = 2048 is outside 1..1024"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [64, 32], "args": ["x", "x", 1, 1])")),
              HasSubstr("block has 2048 threads"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": ["2147483648"], "block": [1], "args": ["x", "x", 1, 1])")),
              HasSubstr("grid.x = 2147483648"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1, 70000], "block": [1], "args": ["x", "x", 1, 1])")),
              HasSubstr("grid.y = 70000"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "x", 1])")),
              HasSubstr("3 args given but the kernel takes 4 parameters"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "ln.wieght", 1, 1])")),
              HasSubstr("launches[0] (row_stats): args[1] \"ln.wieght\": expression 'ln.wieght': unknown name"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "x", "x", 1])")),
              HasSubstr("tensor 'x' is a pointer but the kernel's parameter is 32-bit integer"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "x", "0.5", 1])")),
              HasSubstr("float value for a 32-bit integer parameter"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "shared_bytes": "300000", "args": ["x", "x", 1, 1])")),
              HasSubstr("exceed the device limit"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "x", 1, 1], "bogus": 1)")),
              HasSubstr("unknown key \"bogus\""));
  EXPECT_THAT(PlanError(R"({"launches": [{"kernel": "row_stats", "grid": [1], "block": [1], "args": ["x", "s", 1, 1]}],
                           "scratch": [{"name": "s", "bytes": "1099511627776"}]})"),
              HasSubstr("exceeds the scratch limit"));
  EXPECT_THAT(PlanError(R"({"launches": [{"kernel": "row_stats", "grid": [1], "block": [1], "args": ["x", "x", 1, 1]}],
                           "scratch": [{"name": "x", "bytes": 4}]})"),
              HasSubstr("collides with a tensor"));
  EXPECT_THAT(PlanError(R"({"launches": [{"kernel": "row_stats", "grid": [1], "block": [1], "args": ["x", "x", 1, 1]}],
                           "tensor_map": []})"),
              HasSubstr("unknown key \"tensor_map\""));
}

TEST(PlanTest, ClusterShapeIsChecked) {
  auto ok = ResolvePlan(OneLaunch(R"("grid": [8], "block": [128], "cluster": [2], "args": ["x", "x", 1, 1])"),
                        LayerNormSig(), Kernels(), {});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok->launches[0].cluster)[0], 2);
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [9], "block": [128], "cluster": [2], "args": ["x", "x", 1, 1])")),
              HasSubstr("not a multiple of the cluster"));
}

}  // namespace
}  // namespace ks
