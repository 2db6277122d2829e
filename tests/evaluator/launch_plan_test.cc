#include "evaluator/plan/launch_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

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

// Issue 31: every edge of int64 is an error (InvalidArgument -> invalid_plan),
// never a trap (x86 raises SIGFPE on INT64_MIN / -1) or undefined behaviour.
TEST(ExprTest, EveryArithmeticEdgeIsAnError) {
  Signature s = LayerNormSig();
  auto overflow = [&](const std::string& e) {
    auto r = EvalIntExpr(e, s);
    EXPECT_FALSE(r.ok()) << e << " = " << (r.ok() ? std::to_string(*r) : "");
    return r.ok() ? std::string() : r.status().message();
  };
  const std::string kMin = "(-9223372036854775807 - 1)";
  EXPECT_EQ(*EvalIntExpr(kMin, s), std::numeric_limits<int64_t>::min());
  EXPECT_THAT(overflow(kMin + " / -1"), HasSubstr("integer overflow"));  // the red team's SIGFPE
  EXPECT_THAT(overflow(kMin + " % -1"), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow(kMin + " / (0 - 1)"), HasSubstr("integer overflow"));
  EXPECT_EQ(*EvalIntExpr(kMin + " / 1", s), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*EvalIntExpr(kMin + " % 2", s), 0);
  EXPECT_EQ(*EvalIntExpr(kMin + " / -2", s), int64_t{1} << 62);
  EXPECT_EQ(*EvalIntExpr("-7 % 3", s), -1);  // C semantics: the dividend's sign
  EXPECT_THAT(overflow("5 % 0"), HasSubstr("division by zero"));
  EXPECT_THAT(overflow(kMin + " - 1"), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow("-" + kMin), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow("0 - " + kMin), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow("4611686018427387904 * 2"), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow("-4611686018427387905 * 2"), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow(kMin + " * -1"), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow("max(1, 9223372036854775807 + 1)"), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow("min(1, " + kMin + " - 1)"), HasSubstr("integer overflow"));
  EXPECT_THAT(overflow("cdiv(9223372036854775807 * 2, 3)"), HasSubstr("integer overflow"));
  EXPECT_EQ(*EvalIntExpr("cdiv(9223372036854775807, 1)", s), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(*EvalIntExpr("cdiv(9223372036854775807, 2)", s), int64_t{1} << 62);
  EXPECT_THAT(overflow("x.numel * 9223372036854775807"), HasSubstr("integer overflow"));
  EXPECT_EQ(*EvalIntExpr("9223372036854775807", s), std::numeric_limits<int64_t>::max());
  EXPECT_THAT(overflow("9223372036854775808"), HasSubstr("integer literal too large"));
  EXPECT_THAT(overflow("-9223372036854775808"), HasSubstr("integer literal too large"));
  EXPECT_THAT(overflow("99999999999999999999999999999999"), HasSubstr("integer literal too large"));
}

TEST(ExprTest, NestingAndLengthAreBounded) {
  Signature s = LayerNormSig();
  auto nested = [](int n) { return std::string(n, '(') + "1" + std::string(n, ')'); };
  EXPECT_EQ(*EvalIntExpr(nested(kMaxExprDepth - 1), s), 1);
  EXPECT_THAT(EvalIntExpr(nested(kMaxExprDepth), s).status().message(), HasSubstr("nested deeper than"));
  EXPECT_THAT(EvalIntExpr(std::string(kMaxExprDepth, '-') + "1", s).status().message(),
              HasSubstr("nested deeper than"));
  EXPECT_EQ(*EvalIntExpr(std::string(kMaxExprDepth - 2, '-') + "1", s), 1);
  std::string calls = "1";
  for (int i = 0; i < kMaxExprDepth; ++i) calls = "max(" + calls + ", 0)";
  EXPECT_THAT(EvalIntExpr(calls, s).status().message(), HasSubstr("nested deeper than"));
  EXPECT_THAT(EvalIntExpr(nested(2000), s).status().message(), HasSubstr("nested deeper than"));
  EXPECT_THAT(EvalIntExpr(std::string(kMaxExprChars + 1, '1'), s).status().message(), HasSubstr("longer than"));
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

// Issue 31: JSON integers beyond int64 (nlohmann keeps 2^63..2^64-1 unsigned)
// and sums of the plan's numbers are errors too.
TEST(PlanTest, NumbersBeyondInt64AreErrors) {
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [18446744073709551615], "block": [1], "args": ["x", "x", 1, 1])")),
              HasSubstr("too large"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "x", 9223372036854775808, 1])")),
              HasSubstr("too large"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "x", 1, "(-9223372036854775807 - 1) / -1"])")),
              HasSubstr("integer overflow"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "shared_bytes": 9223372036854775807, "args": ["x", "x", 1, 1])")),
              HasSubstr("exceed the device limit"));  // + the kernel's 1024 static bytes would overflow
  EXPECT_THAT(PlanError(R"({"launches": [{"kernel": "row_stats", "grid": [1], "block": [1], "args": ["x", "s", 1, 1]}],
                           "scratch": [{"name": "s", "bytes": "(-9223372036854775807 - 1) % -1"}]})"),
              HasSubstr("scratch[0] (s): bytes: expression '(-9223372036854775807 - 1) % -1': integer overflow"));
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [2147483647, 65535, 65535], "block": [1], "cluster": [2147483647, 65535, 65535], "args": ["x", "x", 1, 1])")),
              HasSubstr("cluster of"));
}

// A plan whose launches are these, as text.
std::string PlanWithLaunches(int n, const std::string& extra = "") {
  std::string ls;
  for (int i = 0; i < n; ++i)
    ls += std::string(i ? ", " : "") + R"({"kernel": "row_stats", "grid": [1], "block": [1], "args": ["x", "x", 1, 1]})";
  return R"({"launches": [)" + ls + "]" + extra + "}";
}

// Issue 31: size, nesting and counts are limited, and checked on the text
// before the JSON is copied or walked (150,000 nested arrays overflowed the stack).
TEST(PlanTest, SizeNestingAndCountsAreLimited) {
  std::string deep = std::string(150000, '[') + std::string(150000, ']');
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "x", 1, )" + deep + "]")),
              HasSubstr("bytes; the limit is"));
  std::string nest = std::string(kMaxPlanDepth, '[') + std::string(kMaxPlanDepth, ']');
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": ["x", "x", 1, )" + nest + "]")),
              HasSubstr("deeper than 8 levels"));
  EXPECT_THAT(CheckPlanText(std::string(kMaxPlanDepth + 1, '{')).message(), HasSubstr("deeper than"));
  EXPECT_TRUE(CheckPlanText(std::string(kMaxPlanDepth, '{')).ok());
  EXPECT_TRUE(CheckPlanText(R"({"a": "[[[[[[[[[[[[[[[[\"[[[[[[[[[[[[[["})").ok());  // brackets in strings do not count
  EXPECT_TRUE(CheckPlanText(std::string(100, ']') + std::string(kMaxPlanDepth, '[')).ok());
  EXPECT_THAT(PlanError(PlanWithLaunches(1) + std::string(kMaxPlanBytes, ' ')), HasSubstr("bytes; the limit is"));
  EXPECT_TRUE(ResolvePlan(PlanWithLaunches(kMaxLaunches), LayerNormSig(), Kernels(), {}).ok());
  EXPECT_THAT(PlanError(PlanWithLaunches(kMaxLaunches + 1)), HasSubstr("\"launches\" has 65 entries; the limit is 64"));
  std::string args = "\"x\"";
  for (int i = 0; i < kMaxArgsPerLaunch; ++i) args += ", 1";
  EXPECT_THAT(PlanError(OneLaunch(R"("grid": [1], "block": [1], "args": [)" + args + "]")),
              HasSubstr("launches[0]: \"args\" has 129 entries; the limit is 128"));
  std::string scratch, maps;
  for (int i = 0; i <= kMaxScratchBuffers; ++i)
    scratch += std::string(i ? ", " : "") + R"({"name": "s)" + std::to_string(i) + R"(", "bytes": 4})";
  EXPECT_THAT(PlanError(PlanWithLaunches(1, R"(, "scratch": [)" + scratch + "]")), HasSubstr("\"scratch\" has 33"));
  for (int i = 0; i <= kMaxTensorMaps; ++i) maps += std::string(i ? ", " : "") + "{}";
  EXPECT_THAT(PlanError(PlanWithLaunches(1, R"(, "tensor_maps": [)" + maps + "]")),
              HasSubstr("\"tensor_maps\" has 33"));
}

TEST(PlanTest, ParsedValuesAreCheckedWithoutRecursion) {
  nlohmann::json v = nlohmann::json::array();
  for (int i = 0; i < 150000; ++i) v = nlohmann::json::array({std::move(v)});  // built by moves, never copied
  EXPECT_THAT(CheckPlanValue(v).message(), HasSubstr("deeper than"));
  EXPECT_TRUE(CheckPlanValue(nlohmann::json::parse(kGoodPlan)).ok());
  nlohmann::json wide = nlohmann::json::array();
  for (size_t i = 0; i <= kMaxPlanBytes; ++i) wide.push_back(1);
  EXPECT_THAT(CheckPlanValue(wide).message(), HasSubstr("values"));
  auto parsed = ParsePlanJson(kGoodPlan);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ((*parsed)["launches"].size(), 2u);
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
