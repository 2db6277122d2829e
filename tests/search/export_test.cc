// `kernelsearch export` without a GPU: the exported module compiles as the
// evaluator compiles (options and prelude read from evaluator/compile/nvrtc_compile.cc
// itself), its Python launch-plan rules agree with the evaluator's ResolvePlan
// on many plans, and the real binary writes a module that embeds the kernels'
// parameter kinds and the plan as the evaluator resolves it. Needs python3 (no
// torch) and the CUDA headers + ks-worker for NVRTC. The module running on a
// GPU is export_gpu_test.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/plan/launch_plan.h"
#include "evaluator/problem.h"
#include "search/export.h"
#include "search/search_config.h"
#include "store/lineage_store.h"
#include "tests/testing/store_fill.h"
#include "tests/search/export_kernels.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using json = nlohmann::json;

struct PlanCase;

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs python3 on a script of tests/export/; its stdout.
  std::string Python(const std::string& script, const std::vector<std::string>& args = {}) {
    auto python = FindOnPath("python3");
    if (!python) {
      ADD_FAILURE() << "python3 not on PATH";
      return "";
    }
    SubprocessOptions o;
    o.argv = {*python, ks::testing::SourcePath("tests/export/" + script)};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.timeout_s = 120;
    auto r = RunSubprocess(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return "";
    EXPECT_TRUE(r->Succeeded()) << r->Describe() << "\n" << r->err;
    return r->out;
  }

  // The folder of the real export/ks_launch_plan.py, found as `kernelsearch
  // export` finds it.
  std::string ExportDir() {
    auto path = FindDataFile("export/ks_launch_plan.py");
    EXPECT_TRUE(path.ok()) << path.status().ToString();
    return path.ok() ? std::filesystem::path(*path).parent_path().string() : "";
  }

  int CompareWithPython(const Signature& sig, const std::vector<PlanCase>& cases);

  ks::testing::TempDir dir_{"ks_export_test_", ks::testing::TempDir::OnFailure::kKeep};
};

// ---- the compiler's options and prelude ----

TEST(ExportNvrtcTest, PreludeAndOptionsAreTheEvaluators) {
  // One definition serves both (evaluator/compile/compiler.h); the module must carry it whole.
  EXPECT_STREQ(EvaluatorNvrtcPrelude(), NvrtcPrelude());
  EXPECT_EQ(EvaluatorNvrtcOptions(), NvrtcBaseOptions());
  for (const char* name : {"INFINITY", "NAN", "FLT_MAX", "FLT_MIN", "FLT_EPSILON", "DBL_MAX", "M_PI"})
    EXPECT_NE(std::string(NvrtcPrelude()).find(std::string("#define ") + name + " "), std::string::npos) << name;
  bool pre_includes = false;
  for (const auto& o : NvrtcBaseOptions()) pre_includes |= o == std::string("--pre-include=") + kNvrtcPreludeName;
  EXPECT_TRUE(pre_includes);
}

// ---- the module template ----

TEST(ExportTemplateTest, QuotedPlaceholdersBecomeLiteralsAndBareOnesText) {
  auto r = RenderModuleTemplate("\"\"\"candidate @@ID@@ (@@WHAT@@)\"\"\"\nSOURCE = \"@@SOURCE@@\"\nX = json.loads(\"@@X@@\")\n",
                                {{"ID", "7"}, {"WHAT", "a \"quoted\"\\ name\n"}, {"SOURCE", "int a = \"@@ID@@\";\n"},
                                 {"X", "[1, 2]"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "\"\"\"candidate 7 (a  quoted   name )\"\"\"\nSOURCE = \"int a = \\\"@@ID@@\\\";\\n\"\n"
                "X = json.loads(\"[1, 2]\")\n");
  EXPECT_EQ(RenderModuleTemplate("A = \"@@NOPE@@\"", {}).status().code(), Code::kInternal);
  EXPECT_EQ(RenderModuleTemplate("A = \"@@OPEN", {}).status().code(), Code::kInternal);
}

TEST(ExportTemplateTest, TheRealTemplateIsFilledEverywhere) {
  auto path = FindDataFile("export/kernel_module.py");
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  std::string text = *ReadFile(*path);
  std::map<std::string, std::string> values;
  for (const char* k : {"ID", "PROBLEM", "SPEEDUP", "SOURCE", "PLAN", "SIGNATURE", "KERNELS", "RESOLVED",
                        "NVRTC_OPTIONS", "PRELUDE_NAME", "PRELUDE", "CUDA_HOME", "TARGET", "ROBUSTNESS", "JUDGE"})
    values[k] = "v";
  auto r = RenderModuleTemplate(text, values);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->find("@@"), std::string::npos);
  EXPECT_TRUE(LaunchPlanPython().ok());
}

// ---- the launch-plan rules in Python against the evaluator's ----

struct PlanCase {
  std::string plan;
  std::vector<KernelInfo> kernels;
};

KernelInfo Kernel(const std::string& name, std::vector<ParamKind> kinds) {
  KernelInfo k;
  k.name = name;
  for (ParamKind kind : kinds) {
    ParamInfo p;
    p.kind = kind;
    p.size = kind == ParamKind::kB32 || kind == ParamKind::kF32 ? 4 : kind == ParamKind::kBytes ? 128 : 8;
    k.params.push_back(p);
  }
  return k;
}

// One launch of kernel `k` (taking `kinds`) with these args.
PlanCase OneLaunch(std::vector<ParamKind> kinds, const std::string& args, const std::string& extra = "") {
  return {R"({"launches": [{"kernel": "k", "grid": [1], "block": [32], "args": )" + args + "}]" + extra + "}",
          {Kernel("k", std::move(kinds))}};
}

// The names the plans below see: a tensor input, an int and a float scalar, a
// parameter and an output.
Signature PlanSignature() {
  Signature sig;
  sig.inputs.push_back({.name = "x", .dtype = DType::kFloat32, .shape = {8, 1000}, .strides = {1000, 1}});
  sig.inputs.push_back({.name = "n", .is_scalar = true, .dtype = DType::kInt64, .scalar_value = 7});
  sig.inputs.push_back({.name = "alpha", .is_scalar = true, .dtype = DType::kFloat32, .scalar_value = 0.5});
  sig.parameters.push_back({.name = "ln.weight", .dtype = DType::kFloat32, .shape = {1000}, .strides = {1}});
  sig.outputs.push_back({.name = "out", .dtype = DType::kFloat32, .shape = {8, 1000}, .strides = {1000, 1}});
  return sig;
}

// Resolves every case with the evaluator's ResolvePlan and with the real
// export/ks_launch_plan.py, and expects the same answer: the same resolved plan,
// or an error from both. Returns how many plans the evaluator accepted.
int ExportTest::CompareWithPython(const Signature& sig, const std::vector<PlanCase>& cases) {
  json input = json::array();
  std::vector<std::optional<json>> want;
  for (const auto& c : cases) {
    auto plan = ResolvePlan(c.plan, sig, c.kernels, PlanLimits{});
    want.push_back(plan.ok() ? std::optional<json>(ResolvedPlanToJson(*plan)) : std::nullopt);
    input.push_back({{"plan", c.plan}, {"kernels", KernelParamKindsJson(c.kernels)}});
  }
  EXPECT_TRUE(WriteFile(Path("cases.json"), input.dump()).ok());
  EXPECT_TRUE(WriteFile(Path("signature.json"), SignatureToJson(sig).dump()).ok());
  std::string out = Python("resolve_plans.py",
                              {ExportDir(), Path("cases.json"), Path("signature.json")});
  json got = json::parse(out, nullptr, false);
  EXPECT_TRUE(got.is_array()) << out;
  if (!got.is_array() || got.size() != cases.size()) {
    ADD_FAILURE() << "Python answered " << (got.is_array() ? got.size() : 0) << " of " << cases.size() << " cases";
    return 0;
  }
  int accepted = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (want[i]) {
      ++accepted;
      EXPECT_TRUE(got[i].contains("ok")) << "case " << i << ": " << cases[i].plan << "\nPython: " << got[i].dump();
      if (got[i].contains("ok")) {
        EXPECT_EQ(got[i]["ok"], *want[i]) << "case " << i << ": " << cases[i].plan;
      }
    } else {
      EXPECT_TRUE(got[i].contains("error")) << "case " << i << ": the evaluator refuses " << cases[i].plan
                                            << "\nbut Python resolved it to " << got[i].dump();
    }
  }
  return accepted;
}

TEST_F(ExportTest, PythonPlanRulesAgreeWithTheEvaluator) {
  Signature sig = PlanSignature();
  using K = ParamKind;
  const auto b64 = K::kB64, b32 = K::kB32, f32 = K::kF32, f64 = K::kF64, map = K::kBytes;
  std::vector<PlanCase> cases = {
      // What kernels pass: pointers, shapes as int32, numel as int64, a float literal.
      {R"({"launches": [{"kernel": "ln", "grid": ["x.shape[0]"], "block": [256],
           "args": ["x", "ln.weight", "out", "x.shape[1]", "0.00001"]}]})",
       {Kernel("ln", {b64, b64, b64, b32, f32})}},
      OneLaunch({b64, f64, f32}, R"(["x.numel", "x.numel", "x.shape[-1]"])"),
      // Scalars by name: ints into int and float parameters, floats into floats only.
      OneLaunch({b32, f32, f32, f64}, R"(["n", "n", "alpha", "alpha"])"),
      OneLaunch({b32}, R"(["alpha"])"),
      // JSON numbers.
      OneLaunch({b32, f32, f64, b64}, R"([3, 2.5, 3, -4])"),
      OneLaunch({b32}, R"([2.5])"),
      OneLaunch({f32, f64}, R"([1e-5, "1e-5"])"),
      OneLaunch({b64}, R"(["1e-5"])"),
      // C division and remainder, unary signs, min/max/cdiv, spaces.
      OneLaunch({b64, b64, b64, b64, b64, b64},
                R"(["(0 - 7) / 2", "(0-7) % 3", "-7 / -2", "7 % -3", "+3 - -2", " x.shape[ 1 ] * 2 "])"),
      OneLaunch({b64, b64, b64, b64}, R"J(["min(x.shape[0], 3, n)", "max(1, x.shape[-1], n)", "cdiv(x.numel, 256)",
                                          "cdiv(x.numel, 3) % 1000"])J"),
      OneLaunch({b32, b32}, R"(["4294967295", "-2147483648"])"),
      OneLaunch({b32}, R"(["4294967296"])"),
      OneLaunch({b64}, R"(["x.numel * 4611686018427387904"])"),
      OneLaunch({b64}, R"J(["n / (n - 7)"])J"),
      OneLaunch({b64}, R"(["1.5 + 2"])"),
      OneLaunch({b64}, R"(["y.numel"])"),
      OneLaunch({b64}, R"(["x.shape[2]"])"),
      OneLaunch({b64}, R"(["x + 1"])"),
      OneLaunch({b32}, R"(["x"])"),
      OneLaunch({b64}, R"J(["cdiv(n, 0)"])J"),
      OneLaunch({b64}, R"(["alpha * 2"])"),
      OneLaunch({b64, b64}, R"(["x"])"),
      OneLaunch({b64}, R"([true])"),
      // Scratch buffers: sizes from shapes; pointers only.
      OneLaunch({b64}, R"(["partial"])", R"(, "scratch": [{"name": "partial", "bytes": "x.shape[0] * 8"}])"),
      OneLaunch({b32}, R"(["partial"])", R"(, "scratch": [{"name": "partial", "bytes": 64}])"),
      OneLaunch({b64}, R"(["partial"])", R"(, "scratch": [{"name": "partial", "bytes": "0"}])"),
      OneLaunch({b64}, R"(["x"])", R"(, "scratch": [{"name": "x", "bytes": 8}])"),
      // Grids, blocks, shared memory, clusters.
      {R"({"launches": [{"kernel": "k", "grid": ["x.shape[0]", 2], "block": [32, "x.shape[0]"],
           "shared_bytes": "x.shape[1] * 4", "cluster": [2, 1, 1], "args": []}]})",
       {Kernel("k", {})}},
      {R"({"launches": [{"kernel": "k", "grid": "x.shape[0] - 1", "block": 32, "cluster": [2], "args": []}]})",
       {Kernel("k", {})}},
      {R"({"launches": [{"kernel": "k", "grid": [0], "block": [32], "args": []}]})", {Kernel("k", {})}},
      {R"({"launches": [{"kernel": "k", "grid": [1], "block": [2048], "args": []}]})", {Kernel("k", {})}},
      {R"({"launches": [{"kernel": "k", "grid": [1], "block": [64, 32], "args": []}]})", {Kernel("k", {})}},
      {R"({"launches": [{"kernel": "k", "grid": [1], "block": [32], "shared_bytes": "0 - 4", "args": []}]})",
       {Kernel("k", {})}},
      {R"({"launches": [{"kernel": "nope", "grid": [1], "block": [32], "args": []}]})", {Kernel("k", {})}},
      {R"({"launches": [{"kernel": "k", "grid": [1], "block": [32]}], "tensor_maps": []})", {Kernel("k", {})}},
      // TMA tensor maps: defaults from the tensor, every option, scratch, and each rule.
      OneLaunch({map, b64}, R"(["tm", "out"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 8]}])"),
      OneLaunch({map}, R"(["tm"])",
                R"(, "tensor_maps": [{"name": "tm", "tensor": "out", "dtype": "tfloat32", "dims": ["x.shape[1]", 8],
                    "byte_strides": ["x.shape[1] * 4"], "box": [32, "n"], "element_strides": [1, 2],
                    "interleave": "none", "swizzle": "128B", "l2_promotion": "256B", "oob_fill": "nan"}])"),
      OneLaunch({map}, R"(["tm"])",
                R"(, "scratch": [{"name": "s", "bytes": 4096}],
                    "tensor_maps": [{"name": "tm", "tensor": "s", "dtype": "float32", "dims": [32, 32], "box": [32, 32]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "scratch": [{"name": "s", "bytes": 4096}],
                    "tensor_maps": [{"name": "tm", "tensor": "s", "box": [32, 32]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [64, 8], "swizzle": "128B"}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 512]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [2, 8]}])"),
      OneLaunch({map}, R"(["tm"])",
                R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "dims": [1000, 7], "byte_strides": [4004], "box": [32, 8]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "dims": [1000, 9], "box": [32, 8]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 8], "element_strides": [1, 9]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 8], "interleave": "16B"}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 8], "swizle": "none"}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "dtype": "float16", "box": [32, 8]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "out", "tensor": "x", "box": [32, 8]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "n", "box": [32]}])"),
      OneLaunch({map}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 8]},
                                                           {"name": "tm", "tensor": "out", "box": [32, 8]}])"),
      OneLaunch({b64}, R"(["tm"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 8]}])"),
      OneLaunch({map}, R"(["x"])", R"(, "tensor_maps": [{"name": "tm", "tensor": "x", "box": [32, 8]}])"),
      {R"({"launches": [{"kernel": "k", "grid": [1], "block": [32], "stream": 1}]})", {Kernel("k", {})}},
      {R"({"launches": []})", {Kernel("k", {})}},
      {R"J({"launches": [{"kernel": "a", "grid": [1], "block": [32], "args": ["x"]},
                        {"kernel": "b", "grid": ["cdiv(x.numel, 128)"], "block": [128], "args": ["out", "x.numel"]}]})J",
       {Kernel("a", {b64}), Kernel("b", {b64, b64})}},
  };

  int accepted = CompareWithPython(sig, cases);
  EXPECT_GE(accepted, 10);  // the table exercises both outcomes
  EXPECT_LE(accepted, static_cast<int>(cases.size()) - 10);
}

// Random plans from a fixed seed: expressions built from every construct the
// rules know (and some they refuse), in grids, blocks, shared memory, clusters,
// scratch sizes and arguments of every parameter kind.
class PlanGenerator {
 public:
  explicit PlanGenerator(uint32_t seed) : rng_(seed) {}

  PlanCase Next() {
    json plan;
    std::vector<KernelInfo> kernels;
    bool scratch = Chance(0.3);
    if (scratch) plan["scratch"] = json::array({{{"name", "partial"}, {"bytes", IntField()}}});
    bool maps = Chance(0.25);
    if (maps) plan["tensor_maps"] = json::array({TensorMap(scratch)});
    int n = 1 + Pick(3);
    plan["launches"] = json::array();
    for (int l = 0; l < n; ++l) {
      std::string name = "k" + std::to_string(l);
      json launch = {{"kernel", name}, {"grid", Dims(true)}, {"block", Dims(false)}};
      if (Chance(0.3)) launch["shared_bytes"] = SharedBytes();
      if (Chance(0.1)) launch["cluster"] = json::array({1 + Pick(4), 1, 1});
      std::vector<ParamKind> kinds;
      json args = json::array();
      for (int a = Pick(6); a > 0; --a) {
        static const ParamKind kKinds[] = {ParamKind::kB64, ParamKind::kB64, ParamKind::kB32, ParamKind::kF32,
                                           ParamKind::kF64};
        kinds.push_back(kKinds[Pick(5)]);
        args.push_back(Arg(scratch));
      }
      if (maps && Chance(0.6)) {  // the map, mostly where a CUtensorMap parameter takes it
        kinds.push_back(Chance(0.9) ? ParamKind::kBytes : ParamKind::kB64);
        args.push_back(Chance(0.9) ? "tm" : "x");
      }
      if (Chance(0.03)) args.push_back("x");  // one argument too many
      launch["args"] = args;
      plan["launches"].push_back(launch);
      kernels.push_back(Kernel(name, kinds));
    }
    return {plan.dump(), kernels};
  }

 private:
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::string Space() { return Chance(0.2) ? " " : ""; }

  std::string Atom() {
    static const char* kAtoms[] = {"x.shape[0]", "x.shape[1]", "x.shape[-1]", "x.shape[-2]", "x.numel",
                                   "ln.weight.numel", "out.shape[0]", "n", "ln.weight.shape[0]"};
    static const char* kBad[] = {"alpha", "x", "y.numel", "x.shape[2]", "x.shape[-3]", "1.5", "9223372036854775808"};
    switch (Pick(60)) {
      case 0: return kBad[Pick(7)];
      case 1: return std::to_string(std::uniform_int_distribution<int64_t>(0, INT64_MAX)(rng_));
      default: return Chance(0.3) ? std::to_string(1 + Pick(2000)) : kAtoms[Pick(9)];
    }
  }

  std::string Expr(int depth) {
    if (depth <= 0 || Chance(0.35)) return Atom();
    switch (Pick(6)) {
      case 0: return "-" + Expr(depth - 1);
      case 1: return "(" + Expr(depth - 1) + ")";
      case 2: return "cdiv(" + Expr(depth - 1) + "," + Space() + Expr(depth - 1) + ")";
      case 3: {
        std::string f = Chance(0.5) ? "min(" : "max(";
        f += Expr(depth - 1);
        for (int i = Pick(3); i >= 0; --i) f += ", " + Expr(depth - 1);
        return f + ")";
      }
      default: {
        static const char* kOps[] = {"+", "-", "*", "/", "%"};
        return Expr(depth - 1) + Space() + kOps[Pick(5)] + Space() + Expr(depth - 1);
      }
    }
  }

  // A grid dimension or scratch size: a JSON integer or an expression, most
  // often one that a real plan would write.
  json IntField() {
    static const char* kUsual[] = {"x.shape[0]", "cdiv(x.numel, 256)", "cdiv(x.shape[1], 32)", "x.shape[0] * 8",
                                   "max(1, n / 2)", "min(x.shape[-1], 65535)"};
    switch (Pick(4)) {
      case 0: return Pick(4096) - 8;
      case 1: return Expr(2);
      default: return kUsual[Pick(6)];
    }
  }

  // The Python rules know no device, so no device limit on dynamic shared
  // memory (the driver refuses too much at launch): sizes stay under the
  // evaluator's default limit here.
  json SharedBytes() {
    static const char* kExprs[] = {"x.shape[1] * 4", "cdiv(x.numel, 8)", "n * 1024", "0 - 4", "alpha", "x.shape[9]"};
    return Chance(0.5) ? json(Pick(65536) - 8) : json(kExprs[Pick(6)]);
  }

  json Dims(bool grid) {
    if (grid) {
      if (Chance(0.5)) return IntField();
      json d = json::array();
      for (int i = 1 + Pick(3); i > 0; --i) d.push_back(i == 1 || Chance(0.5) ? IntField() : json(1 + Pick(4)));
      return d;
    }
    if (Chance(0.3)) return 32 * (1 + Pick(32));
    json d = json::array({1 << Pick(11)});
    for (int i = Pick(3); i > 0; --i) d.push_back(Chance(0.8) ? json(1 << Pick(4)) : IntField());
    return d;
  }

  // A "tensor_maps" entry named "tm": usually one a kernel would use, often
  // breaking one rule of the driver's or ours.
  json TensorMap(bool scratch) {
    static const char* kTensors[] = {"x", "x", "x", "out", "ln.weight", "n", "nope"};
    static const char* kDtypes[] = {"float32", "tfloat32", "bfloat16", "int32", "uint8", "float64", "bogus"};
    static const char* kSwizzles[] = {"none", "32B", "64B", "128B", "256B"};
    static const char* kInterleaves[] = {"none", "16B", "32B"};
    static const char* kPromotions[] = {"none", "64B", "128B", "256B"};
    json m = {{"name", "tm"}};
    std::string t = scratch && Chance(0.3) ? "partial" : kTensors[Pick(7)];
    m["tensor"] = t;
    const int rank = t == "ln.weight" ? 1 : Chance(0.95) ? 2 : 3;
    auto list = [&](auto&& entry) {
      json l = json::array();
      for (int i = 0; i < rank; ++i) l.push_back(entry(i));
      return l;
    };
    if (t == "partial" || Chance(0.15)) m["dtype"] = kDtypes[Pick(7)];
    if (t == "partial" || Chance(0.3))
      m["dims"] = list([&](int i) -> json {
        static const char* kDims[] = {"x.shape[1]", "x.shape[0]", "x.shape[1] / 2", "n"};
        return Chance(0.2) ? IntField() : Chance(0.5) ? json(i == 0 ? 1000 : 8) : json(kDims[Pick(4)]);
      });
    if (rank > 1 && Chance(0.2)) {
      static const char* kStrides[] = {"x.shape[1] * 4", "4000", "4004", "x.shape[1] * 2"};
      json st = json::array();
      for (int i = 1; i < rank; ++i) st.push_back(Chance(0.2) ? IntField() : json(kStrides[Pick(4)]));
      m["byte_strides"] = st;
    }
    m["box"] = list([&](int) -> json {
      static const int kBoxes[] = {8, 16, 32, 64, 128, 256, 300, 0, 2, 4};
      return Chance(0.1) ? json("n") : json(kBoxes[Pick(10)]);
    });
    if (Chance(0.15)) m["element_strides"] = list([&](int) -> json { return 1 + Pick(9); });
    if (Chance(0.3)) m["swizzle"] = kSwizzles[Pick(5)];
    if (Chance(0.1)) m["interleave"] = kInterleaves[Pick(3)];
    if (Chance(0.2)) m["l2_promotion"] = kPromotions[Pick(4)];
    if (Chance(0.15)) m["oob_fill"] = Chance(0.8) ? "zero" : "nan";
    if (Chance(0.02)) m["bogus"] = 1;
    return m;
  }

  json Arg(bool scratch) {
    static const char* kNames[] = {"x", "out", "ln.weight", "n", "alpha", "0.00001", "1e-5", "-2.5e3"};
    switch (Pick(12)) {
      case 0: return scratch ? json("partial") : json("x");
      case 1: case 2: case 3: return kNames[Pick(8)];
      case 4: return Pick(100000) - 50000;
      case 5: {
        static const double kFloats[] = {2.5, 1e-5, -0.125, 3.0};
        return kFloats[Pick(4)];
      }
      default: return Expr(2);
    }
  }

  std::mt19937 rng_;
};

TEST_F(ExportTest, PythonPlanRulesAgreeOnGeneratedPlans) {
  PlanGenerator gen(20261123);
  std::vector<PlanCase> cases;
  for (int i = 0; i < 3000; ++i) cases.push_back(gen.Next());
  int with_maps = 0, maps_accepted = 0;
  for (const auto& c : cases)
    if (c.plan.find("tensor_maps") != std::string::npos) {
      ++with_maps;
      if (ResolvePlan(c.plan, PlanSignature(), c.kernels, PlanLimits{}).ok()) ++maps_accepted;
    }
  EXPECT_GE(with_maps, 500);
  EXPECT_GE(maps_accepted, 20);  // maps that resolve, not only ones refused (28 at this seed)
  int accepted = CompareWithPython(PlanSignature(), cases);
  EXPECT_GE(accepted, 300);  // both outcomes, often
  EXPECT_LE(accepted, static_cast<int>(cases.size()) - 300);
}

// At call time expressions follow the call's tensors, not the signature.
TEST_F(ExportTest, PythonPlanRulesFollowTheCallsShapes) {
  std::string out = Python("resolve_at_shapes.py",
                           {ExportDir(), testing::kLayerNormPlan});
  json r = json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  EXPECT_EQ(r["scratch"], json::parse(R"([{"name": "stats", "bytes": 8000}])"));
  EXPECT_EQ(r["launches"][0]["grid"], json::parse("[1000, 1, 1]"));
  EXPECT_EQ(r["launches"][0]["args"][2], json::parse(R"({"kind": "i32", "value": 1024})"));
  EXPECT_EQ(r["launches"][0]["args"][3], json::parse(R"({"kind": "f32", "value": 1e-05})"));
  EXPECT_EQ(r["launches"][1]["grid"], json::parse("[4000, 1, 1]"));
  EXPECT_EQ(r["launches"][1]["args"][5], json::parse(R"({"kind": "i64", "value": 1024000})"));
}

// The real binary on a store filled through its API.
class ExportCliTest : public ExportTest {
 protected:
  // A layernorm problem (tests/evaluator/gpu_fixtures/layernorm_small.py's
  // signature) with one candidate; returns the candidate's id.
  int64_t Fill(const std::string& source, const std::string& plan, const Robustness* robustness = nullptr) {
    auto store = store::LineageStore::Open(Path("ks.db"));
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!store.ok()) return 0;
    Signature sig;
    sig.name = "layernorm_small";
    sig.inputs.push_back({.name = "x", .dtype = DType::kFloat32, .shape = {4096, 1024}, .strides = {1024, 1}});
    sig.parameters.push_back({.name = "ln.weight", .dtype = DType::kFloat32, .shape = {1024}, .strides = {1}});
    sig.parameters.push_back({.name = "ln.bias", .dtype = DType::kFloat32, .shape = {1024}, .strides = {1}});
    sig.outputs.push_back({.name = "out", .dtype = DType::kFloat32, .shape = {4096, 1024}, .strides = {1024, 1}});
    store::ProblemRow p;
    p.name = "layernorm_small";
    p.file_path = "layernorm_small.py";
    p.source = "import torch\n# layernorm_small\n";
    p.signature_json = SignatureToJson(sig).dump();
    return testing::StoreCorrectSeed(store->get(), p, source, plan, "NVIDIA H100 80GB HBM3", 1.75, robustness);
  }

  SubprocessResult Export(int64_t id, const std::string& out, const std::vector<std::string>& extra = {}) {
    SubprocessOptions o;
    o.argv = {ks::testing::CliBinary(), "export", std::to_string(id), "--db", Path("ks.db"), "--out", out};
    o.argv.insert(o.argv.end(), extra.begin(), extra.end());
    o.timeout_s = 180;
    auto r = RunSubprocess(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }
};

TEST_F(ExportCliTest, TheModuleEmbedsWhatTheEvaluatorSees) {
  int64_t id = Fill(testing::kLayerNormSource, testing::kLayerNormPlan);
  SubprocessResult r = Export(id, Path("out"));
  ASSERT_TRUE(r.Succeeded()) << r.Describe() << "\n" << r.err;
  for (const char* f : {"kernel.cu", "plan.json", "problem.py", "ks_launch_plan.py", "kernel_module.py"})
    EXPECT_TRUE(std::filesystem::exists(Path("out/") + f)) << f;
  EXPECT_EQ(*ReadFile(Path("out/kernel.cu")), testing::kLayerNormSource);
  EXPECT_EQ(*ReadFile(Path("out/ks_launch_plan.py")), *ReadFile(ExportDir() + "/ks_launch_plan.py"));
  // The constants, read without importing (no torch here).
  std::string out = Python("module_constants.py",
                           {Path("out/kernel_module.py")});
  json m = json::parse(out, nullptr, false);
  ASSERT_TRUE(m.is_object()) << out;
  EXPECT_EQ(m["SOURCE"], testing::kLayerNormSource);
  EXPECT_EQ(m["PRELUDE"], EvaluatorNvrtcPrelude());
  EXPECT_EQ(m["PRELUDE_NAME"], "ks_prelude.h");
  EXPECT_EQ(m["NVRTC_OPTIONS"], json(EvaluatorNvrtcOptions()));
  // Parameter kinds from the PTX: int -> b32, float -> f32, long long and pointers -> b64.
  EXPECT_EQ(m["KERNELS"], json::parse(R"({"row_stats": ["b64", "b64", "b32", "f32"],
                                          "normalize": ["b64", "b64", "b64", "b64", "b64", "b64", "b32"]})"));
  EXPECT_EQ(m["RESOLVED"], json::parse(R"({"launches": [
    {"kernel": "row_stats", "grid": [4096, 1, 1], "block": [256, 1, 1], "shared": 0, "cluster": null,
     "args": [{"kind": "tensor", "name": "x"}, {"kind": "scratch", "name": "stats"}, {"kind": "i32", "value": 1024},
              {"kind": "f32", "value": 1e-05}]},
    {"kernel": "normalize", "grid": [16384, 1, 1], "block": [256, 1, 1], "shared": 0, "cluster": null,
     "args": [{"kind": "tensor", "name": "x"}, {"kind": "scratch", "name": "stats"},
              {"kind": "tensor", "name": "ln.weight"}, {"kind": "tensor", "name": "ln.bias"},
              {"kind": "tensor", "name": "out"}, {"kind": "i64", "value": 4194304}, {"kind": "i32", "value": 1024}]}],
    "scratch": [{"name": "stats", "bytes": 32768}]})"));
  EXPECT_EQ(m["SIGNATURE"]["parameters"][0]["name"], "ln.weight");
  EXPECT_TRUE(std::filesystem::exists(m.value("EXPORT_CUDA_HOME", "") + "/include/cuda_fp16.h"));
  std::string module = *ReadFile(Path("out/kernel_module.py"));
  EXPECT_NE(module.find("correct, 1.75x over PyTorch eager on NVIDIA H100 80GB HBM3"), std::string::npos);
  EXPECT_NE(module.find("class ModelNew(_problem.Model):"), std::string::npos);
}

SubprocessResult RunCli(const std::vector<std::string>& args) {
  SubprocessOptions o;
  o.argv = {ks::testing::CliBinary()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.timeout_s = 120;
  auto r = RunSubprocess(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : SubprocessResult{};
}

// Issue 27: a kernel that a distribution-shifted input set broke is marked in
// `show`, its --json and the report's data, and `export` refuses it unless told.
TEST_F(ExportCliTest, ASpecialisedKernelIsMarkedEverywhereAndExportedOnlyWhenAllowed) {
  Robustness r{{{"get_inputs", "held", "3 input set(s) from get_inputs()"},
                {"scale_up", "broke", "floating-point inputs x 1e5: output 'out' wrong"},
                {"shapes", "not_checked", "the problem declares one shape"}},
               "scale_up"};
  int64_t id = Fill(testing::kLayerNormSource, testing::kLayerNormPlan, &r);
  const std::string db = Path("ks.db");

  SubprocessResult show = RunCli({"show", std::to_string(id), "--db", db});
  ASSERT_TRUE(show.Succeeded()) << show.err;
  EXPECT_NE(show.out.find("specialised: correct on the get_inputs() sets, but 'scale_up' broke it"),
            std::string::npos) << show.out;
  EXPECT_NE(show.out.find("scale_up    broke"), std::string::npos) << show.out;
  SubprocessResult show_json = RunCli({"show", std::to_string(id), "--db", db, "--json"});
  json sj = json::parse(show_json.out, nullptr, false);
  ASSERT_TRUE(sj.is_object()) << show_json.out;
  EXPECT_TRUE(sj["evaluation"]["robustness"]["specialised"].get<bool>());
  EXPECT_EQ(sj["evaluation"]["robustness"]["broken_by"], "scale_up");

  SubprocessResult report = RunCli({"report", "1", "--db", db, "--json"});
  ASSERT_TRUE(report.Succeeded()) << report.err;
  json rj = json::parse(report.out, nullptr, false);
  ASSERT_TRUE(rj.is_object()) << report.out.substr(0, 500);
  bool found = false;
  for (const auto& c : rj["candidates"])
    if (c["id"] == id) {
      found = true;
      EXPECT_TRUE(c["specialised"].get<bool>());
      EXPECT_NE(c["robustness"].get<std::string>().find("'scale_up' broke it"), std::string::npos);
    }
  EXPECT_TRUE(found);

  SubprocessResult refused = Export(id, Path("refused"));
  EXPECT_FALSE(refused.Succeeded());
  EXPECT_NE(refused.err.find("--allow-specialised"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("scale_up"), std::string::npos) << refused.err;
  EXPECT_FALSE(std::filesystem::exists(Path("refused/kernel_module.py")));

  SubprocessResult allowed = Export(id, Path("allowed"), {"--allow-specialised"});
  ASSERT_TRUE(allowed.Succeeded()) << allowed.err;
  json m = json::parse(Python("module_constants.py", {Path("allowed/kernel_module.py")}), nullptr, false);
  ASSERT_TRUE(m.is_object());
  EXPECT_TRUE(m["ROBUSTNESS"]["specialised"].get<bool>());
  std::string module = *ReadFile(Path("allowed/kernel_module.py"));
  EXPECT_NE(module.find("SPECIALISED: specialised: correct on the get_inputs() sets, but 'scale_up' broke it"),
            std::string::npos);
  EXPECT_NE(module.find("def check(model, *inputs):"), std::string::npos);
  EXPECT_NE(module.find("def benchmark(model, *inputs"), std::string::npos);
}

TEST_F(ExportCliTest, AKernelThatDoesNotCompileOrResolveIsNotExported) {
  int64_t broken = Fill("extern \"C\" __global__ void k(float* out) { out[0] = undefined_name; }",
                        R"({"launches": [{"kernel": "k", "grid": [1], "block": [1], "args": ["out"]}]})");
  SubprocessResult r = Export(broken, Path("broken"));
  EXPECT_FALSE(r.Succeeded());
  EXPECT_NE(r.err.find("does not compile"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(Path("broken/kernel_module.py")));

  int64_t bad_plan = Fill(testing::kLayerNormSource,
                          R"({"launches": [{"kernel": "row_stats", "grid": [1], "block": [1], "args": ["x"]}]})");
  r = Export(bad_plan, Path("bad_plan"));
  EXPECT_FALSE(r.Succeeded());
  EXPECT_NE(r.err.find("4 parameters"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ks
