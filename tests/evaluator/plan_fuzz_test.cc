// Issue 31, "no plan can crash the trusted process": random, mutated and
// hostile launch plans through the evaluator's entry points (ParsePlanJson,
// ResolvePlan against a signature and kernels, EvalIntExpr, the model-reply
// parser), asserting that each returns, and that every failure is an
// InvalidArgument Status (-> invalid_plan). Bounded for CI: kCases cases or
// kBudget, whichever comes first; the seed is printed with every failure
// (KS_PLAN_FUZZ_SEED=N reruns one, KS_PLAN_FUZZ_CASES=N runs longer).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "evaluator/compile/candidate_parser.h"
#include "evaluator/plan/launch_plan.h"

namespace ks {
namespace {

using ::testing::HasSubstr;

constexpr int kCases = 20000;
constexpr auto kBudget = std::chrono::seconds(5);
constexpr uint64_t kDefaultSeed = 20260531;

// The names plans see: as launch_plan_test's layer norm, plus an int scalar.
Signature FuzzSig() {
  Signature s;
  s.inputs = {{"x", false, DType::kFloat32, {64, 4096}, {4096, 1}},
              {"eps", true, DType::kFloat32, {}, {}, 1e-5},
              {"n", true, DType::kInt64, {}, {}, 7}};
  s.parameters = {{"ln.weight", false, DType::kFloat32, {4096}, {1}}};
  s.outputs = {{"out", false, DType::kFloat32, {64, 4096}, {4096, 1}}};
  return s;
}

std::vector<KernelInfo> FuzzKernels() {
  KernelInfo k{"k", {{ParamKind::kB64, 8, 8}, {ParamKind::kB64, 8, 8}, {ParamKind::kB32, 4, 4}, {ParamKind::kF32, 4, 4}}, {}};
  KernelInfo tma{"tma", {{ParamKind::kBytes, 128, 64}, {ParamKind::kB64, 8, 8}}, {}};
  k.resources.static_shared_bytes = 1024;
  return {k, tma};
}

uint64_t SeedFromEnv() {
  const char* s = std::getenv("KS_PLAN_FUZZ_SEED");
  return s ? std::strtoull(s, nullptr, 10) : kDefaultSeed;
}

int CasesFromEnv() {
  const char* s = std::getenv("KS_PLAN_FUZZ_CASES");
  return s ? std::atoi(s) : kCases;
}

// A generator of plan text: valid plans, plans near every edge, and mutations.
class PlanFuzzer {
 public:
  explicit PlanFuzzer(uint64_t seed) : rng_(seed) {}

  std::string Next() {
    switch (Pick(10)) {
      case 0: return RandomBytes();
      case 1: return Truncate(Plan());
      case 2: case 3: case 4: return Mutate(Plan());
      default: return Plan();
    }
  }

  std::string Expr(int depth) {
    if (depth <= 0 || Chance(0.3)) return Atom();
    switch (Pick(8)) {
      case 0: return "-" + Expr(depth - 1);
      case 1: return "(" + Expr(depth - 1) + ")";
      case 2: return "cdiv(" + Expr(depth - 1) + ", " + Expr(depth - 1) + ")";
      case 3: return std::string(Chance(0.5) ? "min(" : "max(") + Expr(depth - 1) + ", " + Expr(depth - 1) + ")";
      case 4: return "x.shape[" + Expr(depth - 1) + "]";
      default: {
        static const char* kOps[] = {" + ", " - ", " * ", " / ", " % "};
        return Expr(depth - 1) + kOps[Pick(5)] + Expr(depth - 1);
      }
    }
  }

 private:
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  size_t Pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  std::string Atom() {
    static const char* kAtoms[] = {
        "0", "1", "-1", "2", "7", "256", "4096", "2147483647", "2147483648", "4294967295", "9223372036854775807",
        "9223372036854775808", "18446744073709551616", "(-9223372036854775807 - 1)", "4611686018427387904",
        "x.numel", "x.shape[0]", "x.shape[-1]", "x.shape[9]", "ln.weight.numel", "n", "eps", "x", "nope",
        "1.5", "1e400", "", "(", ")", "cdiv(", "min()", "max(1,)", "x.shape[", "--1", "+-+1"};
    return kAtoms[Pick(sizeof(kAtoms) / sizeof(kAtoms[0]))];
  }

  // A JSON value where an integer field goes: a number, an expression, or junk.
  std::string Field() {
    switch (Pick(8)) {
      case 0: return std::to_string(static_cast<int64_t>(rng_()));
      case 1: return std::to_string(rng_());  // often past INT64_MAX (an unsigned JSON number)
      case 2: return Pick(2) ? "1e300" : "-0.0";
      case 3: return Junk();
      default: return "\"" + Expr(1 + Pick(4)) + "\"";
    }
  }

  std::string Junk() {
    static const char* kJunk[] = {"null", "true", "[]", "{}", "[[1]]", "{\"a\": 1}", "\"\"", "-9223372036854775808",
                                  "99999999999999999999999999", "1e999"};
    return kJunk[Pick(sizeof(kJunk) / sizeof(kJunk[0]))];
  }

  std::string Dims() {
    if (Chance(0.2)) return Field();
    std::string d = "[";
    for (size_t i = 0, n = Chance(0.9) ? 1 + Pick(3) : Pick(6); i < n; ++i) d += (i ? ", " : "") + Field();
    return d + "]";
  }

  std::string Arg() {
    static const char* kArgs[] = {"\"x\"", "\"out\"", "\"ln.weight\"", "\"s\"", "\"tm\"", "\"n\"", "\"eps\"",
                                  "\"1e-5\"", "\"1e400\"", "2.5", "-3", "\"nope\""};
    if (Chance(0.4)) return kArgs[Pick(sizeof(kArgs) / sizeof(kArgs[0]))];
    return Field();
  }

  std::string Launch() {
    if (Chance(0.4)) {  // a launch a real plan would write, with a field or two at random
      return R"({"kernel": "k", "grid": )" + std::string(Chance(0.7) ? R"J(["cdiv(x.numel, 256)"])J" : Dims()) +
             R"(, "block": )" + (Chance(0.8) ? "[256]" : Dims()) + R"(, "args": ["x", )" +
             (Chance(0.8) ? "\"out\"" : Arg()) + ", " + (Chance(0.8) ? "\"x.shape[0]\"" : Arg()) + ", " +
             (Chance(0.8) ? "\"eps\"" : Arg()) + "]}";
    }
    std::string l = "{\"kernel\": \"" + std::string(Chance(0.8) ? "k" : Chance(0.5) ? "tma" : "nope") + "\"";
    if (Chance(0.95)) l += ", \"grid\": " + Dims();
    if (Chance(0.95)) l += ", \"block\": " + Dims();
    if (Chance(0.3)) l += ", \"shared_bytes\": " + Field();
    if (Chance(0.1)) l += ", \"cluster\": " + Dims();
    if (Chance(0.02)) l += ", \"bogus\": 1";
    if (Chance(0.95)) {
      l += ", \"args\": [";
      for (size_t i = 0, n = Chance(0.8) ? 4 : Pick(2) ? 2 : Pick(200); i < n; ++i) l += (i ? ", " : "") + Arg();
      l += "]";
    }
    return l + "}";
  }

  std::string TensorMap() {
    std::string m = "{\"name\": \"tm\", \"tensor\": \"" + std::string(Chance(0.7) ? "x" : Chance(0.5) ? "s" : "n") + "\"";
    if (Chance(0.3)) m += ", \"dtype\": \"float32\"";
    if (Chance(0.4)) m += ", \"dims\": " + Dims();
    if (Chance(0.3)) m += ", \"byte_strides\": " + Dims();
    m += ", \"box\": " + Dims();
    if (Chance(0.2)) m += ", \"element_strides\": " + Dims();
    if (Chance(0.2)) m += ", \"swizzle\": \"128B\"";
    return m + "}";
  }

  std::string Plan() {
    std::string p = "{\"launches\": [";
    for (size_t i = 0, n = Chance(0.9) ? 1 + Pick(3) : Pick(kMaxLaunches + 3); i < n; ++i)
      p += (i ? ", " : "") + Launch();
    p += "]";
    if (Chance(0.4)) {
      p += ", \"scratch\": [";
      for (size_t i = 0, n = Chance(0.9) ? 1 : Pick(kMaxScratchBuffers + 3); i < n; ++i)
        p += std::string(i ? ", " : "") + "{\"name\": \"s" + (i ? std::to_string(i) : "") + "\", \"bytes\": " + Field() + "}";
      p += "]";
    }
    if (Chance(0.2)) {
      p += ", \"tensor_maps\": [";
      for (size_t i = 0, n = Chance(0.9) ? 1 : Pick(kMaxTensorMaps + 3); i < n; ++i) p += (i ? ", " : "") + TensorMap();
      p += "]";
    }
    return p + "}";
  }

  std::string RandomBytes() {
    std::string s(Pick(200), '\0');
    for (char& c : s) c = static_cast<char>(Chance(0.5) ? "[]{}\",:0123456789-e.\\ "[Pick(23)] : Pick(256));
    return s;
  }

  std::string Truncate(const std::string& s) { return s.substr(0, Pick(s.size() + 1)); }

  // Edits of a plan's text: deep nesting, huge and edge numbers, spliced junk.
  std::string Mutate(std::string s) {
    for (size_t edits = 1 + Pick(3); edits > 0; --edits) {
      size_t at = Pick(s.size() + 1);
      switch (Pick(8)) {
        case 0: {  // deep nesting, up to far past the limit
          size_t n = Chance(0.8) ? Pick(2 * kMaxPlanDepth) : 1000 + Pick(20000);
          s.insert(at, std::string(n, Chance(0.5) ? '[' : '{') + std::string(Chance(0.5) ? n : 0, ']'));
          break;
        }
        case 1: s.insert(at, Chance(0.5) ? "9223372036854775808" : "-9223372036854775809"); break;
        case 2: s.insert(at, "(-9223372036854775807 - 1) / -1"); break;
        case 3: s.insert(at, std::string(Pick(3) ? 1 + Pick(64) : kMaxPlanBytes, ' ')); break;
        case 4: if (at < s.size()) s.erase(at, 1 + Pick(8)); break;
        case 5: if (at < s.size()) s[at] = static_cast<char>(Pick(256)); break;
        case 6: s.insert(at, Junk()); break;
        default: s.insert(at, "\"" + Expr(3) + "\""); break;
      }
    }
    return s;
  }

  std::mt19937_64 rng_;
};

// One plan text through every entry point; a failure must be a Status. Whether
// the evaluator accepted it.
bool CheckOnePlan(const std::string& text, const Signature& sig, const std::vector<KernelInfo>& kernels) {
  auto parsed = ParsePlanJson(text);
  if (!parsed.ok()) {
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument) << parsed.status().ToString();
  } else {
    EXPECT_TRUE(CheckPlanValue(*parsed).ok());  // what passed the text guard passes the value guard
  }
  auto plan = ResolvePlan(text, sig, kernels, PlanLimits{});
  if (!plan.ok()) {
    EXPECT_EQ(plan.status().code(), Code::kInvalidArgument) << plan.status().ToString();
    EXPECT_FALSE(plan.status().message().empty());
    return false;
  }
  EXPECT_TRUE(parsed.ok()) << "ResolvePlan accepted what ParsePlanJson refused";
  EXPECT_LE(plan->launches.size(), static_cast<size_t>(kMaxLaunches));
  EXPECT_LE(plan->scratch.size(), static_cast<size_t>(kMaxScratchBuffers));
  EXPECT_LE(plan->tensor_maps.size(), static_cast<size_t>(kMaxTensorMaps));
  EXPECT_LE(text.size(), kMaxPlanBytes);
  for (const auto& l : plan->launches) {
    EXPECT_LE(l.args.size(), static_cast<size_t>(kMaxArgsPerLaunch));
    for (int d = 0; d < 3; ++d) {
      EXPECT_GE(l.grid[d], 1);
      EXPECT_GE(l.block[d], 1);
    }
    EXPECT_GE(l.shared_bytes, 0);
  }
  for (const auto& s : plan->scratch) EXPECT_GT(s.bytes, 0);
  return true;
}

// As a model reply: the ```json block goes through the reply parser first.
void CheckOneReply(const std::string& plan) {
  auto c = ParseCandidateMarkdown("```cuda\nextern \"C\" __global__ void k() {}\n```\n```json\n" + plan + "\n```\n");
  if (!c.ok()) {
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status().ToString();
  }
}

TEST(PlanFuzzTest, RedTeamPlansAreInvalidPlansNotCrashes) {
  Signature sig = FuzzSig();
  auto kernels = FuzzKernels();
  auto error = [&](const std::string& plan) {
    auto p = ResolvePlan(plan, sig, kernels, PlanLimits{});
    EXPECT_FALSE(p.ok()) << plan.substr(0, 200);
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), Code::kInvalidArgument);
    }
    return p.ok() ? std::string() : p.status().message();
  };
  auto launch = [](const std::string& last_arg) {
    return R"({"launches": [{"kernel": "k", "grid": [1], "block": [32], "args": ["x", "out", )" + last_arg +
           R"(, 1.0]}]})";
  };
  // SIGFPE: INT64_MIN / -1, and INT64_MIN % -1.
  EXPECT_THAT(error(launch(R"("(-9223372036854775807 - 1) / -1")")), HasSubstr("integer overflow"));
  EXPECT_THAT(error(launch(R"("(-9223372036854775807 - 1) % -1")")), HasSubstr("integer overflow"));
  EXPECT_THAT(error(R"({"launches": [{"kernel": "k", "grid": ["(-9223372036854775807 - 1) / -1"], "block": [32],
                        "args": ["x", "out", 1, 1.0]}]})"),
              HasSubstr("integer overflow"));
  // A stack overflow: 150,000 nested arrays as an argument.
  std::string deep = std::string(150000, '[') + std::string(150000, ']');
  EXPECT_THAT(error(launch(deep)), HasSubstr("the limit is"));
  CheckOneReply(launch(deep));
  auto reply = ParseCandidateMarkdown("```cuda\n__global__ void k() {}\n```\n```json\n" + launch(deep) + "\n```\n");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();  // taken as the plan, for the evaluator to refuse
  EXPECT_THAT(error(reply->plan_json), HasSubstr("the limit is"));
  // The same nesting within the size limit, unbalanced, and in an object.
  std::string small = std::string(20000, '[') + std::string(20000, ']');
  EXPECT_THAT(error(launch(small)), HasSubstr("deeper than"));
  EXPECT_THAT(error(launch(std::string(30000, '['))), HasSubstr("deeper than"));
  EXPECT_THAT(error(std::string(30000, '{')), HasSubstr("deeper than"));
}

TEST(PlanFuzzTest, RandomPlansNeverCrashTheResolver) {
  const uint64_t seed = SeedFromEnv();
  const int cases = CasesFromEnv();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with KS_PLAN_FUZZ_SEED=" + std::to_string(seed) + ")");
  Signature sig = FuzzSig();
  auto kernels = FuzzKernels();
  PlanFuzzer fuzz(seed);
  const auto start = std::chrono::steady_clock::now();
  int run = 0, accepted = 0;
  for (; run < cases && std::chrono::steady_clock::now() - start < kBudget; ++run) {
    std::string text = fuzz.Next();
    SCOPED_TRACE("case " + std::to_string(run) + ": " + text.substr(0, 300));
    if (CheckOnePlan(text, sig, kernels)) ++accepted;
    if (run % 10 == 0) CheckOneReply(text);
    if (HasFailure()) break;  // the first failing case, with its seed, is enough
  }
  std::printf("plan fuzz: seed %llu, %d cases, %d accepted\n", static_cast<unsigned long long>(seed), run, accepted);
  EXPECT_GE(run, 1000) << "too few cases in the time budget";
  EXPECT_GE(accepted, run / 200) << "the generator should also make valid plans";
}

TEST(PlanFuzzTest, RandomExpressionsNeverCrashTheEvaluator) {
  const uint64_t seed = SeedFromEnv() + 1;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Signature sig = FuzzSig();
  PlanFuzzer fuzz(seed);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCases && std::chrono::steady_clock::now() - start < std::chrono::seconds(2); ++i) {
    std::string e = fuzz.Expr(1 + i % 12);
    auto v = EvalIntExpr(e, sig);
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), Code::kInvalidArgument) << e;
    }
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace ks
