// The judge unit (evaluator/judge/judge.h, issue 36): contract names and
// aliases, the per-block bound, the tolerance of an output under each
// contract, and the constants the bridge's Python reads kept in step with
// the C++ ones (evaluator/reference/ks_bridge/judge.py).
#include "evaluator/judge/judge.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>

#include "common/files.h"
#include "evaluator/problem.h"
#include "evaluator/reference/bridge_internal.h"
#include "tests/testing/paths.h"

namespace ks {
namespace {

TEST(JudgeTest, ContractsHavePyTorchsNamesAndTheOldOnesAreAliases) {
  for (const char* name : {"highest", "high", "medium", "kernelbench"}) {
    auto c = ParseContract(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_STREQ(ContractName(*c), name);
  }
  EXPECT_EQ(*ParseContract("fp32"), Contract::kHighest);
  EXPECT_EQ(*ParseContract("tf32"), Contract::kHigh);
  EXPECT_EQ(CanonicalContract("fp32"), "highest");
  EXPECT_EQ(CanonicalContract("tf32"), "high");
  auto bad = ParseContract("bf16");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("highest, high, medium or kernelbench"), std::string::npos);
  EXPECT_EQ(ContractNames().size(), 6u);
}

TEST(JudgeTest, TheBoundIsTheContractsFactorTimesPyTorchsOwnErrorPerBlock) {
  const std::vector<float> highest = {0.f, 1e-6f, 2e-3f, INFINITY};
  const std::vector<float> tf32 = {1e-3f, 1e-3f, 1e-3f, 0.f};
  auto h = CombineBounds(Contract::kHighest, highest, tf32);  // the level's array is not used under highest
  EXPECT_FLOAT_EQ(h[0], 0.f);
  EXPECT_FLOAT_EQ(h[1], 16e-6f);
  EXPECT_FLOAT_EQ(h[2], 32e-3f);
  EXPECT_TRUE(std::isinf(h[3]));  // PyTorch non-finite where float64 is finite: anything goes there
  auto hi = CombineBounds(Contract::kHigh, highest, tf32);
  EXPECT_FLOAT_EQ(hi[0], 4e-3f);   // TF32's error allowed
  EXPECT_FLOAT_EQ(hi[2], 32e-3f);  // never less than highest's
  auto none = CombineBounds(Contract::kHigh, highest, {});
  EXPECT_FLOAT_EQ(none[1], 16e-6f);
}

TEST(JudgeTest, KernelBenchIsAllcloseAtOneHundredthAndTheOthersWidenTheNormByTheSetsOwnError) {
  Signature sig;
  TensorSpec out{"out", false, DType::kFloat32, {8}, {1}, 0};
  sig.outputs.push_back(out);
  Tolerance kb = ToleranceFor(sig, out, nullptr, Contract::kKernelBench);
  EXPECT_DOUBLE_EQ(kb.atol, kKernelBenchAtol);
  EXPECT_DOUBLE_EQ(kb.rtol, kKernelBenchRtol);
  EXPECT_EQ(kb.rel_norm, 0);  // no norm rule: KernelBench's harness has none
  Tolerance plain = ToleranceFor(sig, out, nullptr, Contract::kHighest);
  EXPECT_DOUBLE_EQ(plain.atol, DefaultTolerance(DType::kFloat32).atol);
  PyTorchError ill{1.0, 0.5, 10.0, 12288};
  Tolerance wide = ToleranceFor(sig, out, &ill, Contract::kHighest);
  EXPECT_DOUBLE_EQ(wide.rel_norm, 16 * 0.5);  // the bound PyTorch itself needs on this set
  EXPECT_DOUBLE_EQ(wide.atol, plain.atol);    // the element-wise part widens per block, not here
}

TEST(JudgeTest, BoundArraysAreKeysOfTheirOutputAtALevel) {
  Signature sig;
  sig.inputs.push_back({"x", false, DType::kFloat32, {1000}, {1}, 0});
  sig.outputs.push_back({"out", false, DType::kFloat32, {1000}, {1}, 0});
  auto k = bridge_internal::SetTensorKey(sig, BoundKey("out", "high"));
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->second, 4 * 4);  // ceil(1000 / 256) floats
  EXPECT_EQ(bridge_internal::SetTensorKey(sig, "x")->second, 4000);
  EXPECT_FALSE(bridge_internal::SetTensorKey(sig, "x@highest").ok());   // not an output
  EXPECT_FALSE(bridge_internal::SetTensorKey(sig, "out@lowest").ok());  // not a level
}

// The bridge's Python reads the same constants: each `NAME = value` line of
// ks_bridge/judge.py against the C++ constant.
TEST(JudgeTest, ThePythonJudgeHoldsTheSameConstants) {
  auto text = ReadFile(ks::testing::SourcePath("evaluator/reference/ks_bridge/judge.py"));
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto number = [&](const std::string& name) {
    std::smatch m;
    std::regex re("(^|\\n)" + name + "\\s*=\\s*([0-9.eE+-]+)");
    if (!std::regex_search(*text, m, re)) return std::nan("");
    return std::stod(m[2]);
  };
  EXPECT_EQ(number("BOUND_BLOCK"), kBoundBlock);
  EXPECT_EQ(number("KERNELBENCH_ATOL"), kKernelBenchAtol);
  EXPECT_EQ(number("KERNELBENCH_RTOL"), kKernelBenchRtol);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*text, m, std::regex("FACTOR\\s*=\\s*\\{([^}]*)\\}"))) << "FACTOR = {...} in judge.py";
  const std::string factors = m[1];
  for (Contract c : {Contract::kHighest, Contract::kHigh, Contract::kMedium, Contract::kKernelBench}) {
    std::smatch f;
    ASSERT_TRUE(std::regex_search(factors, f, std::regex(std::string("\"") + ContractName(c) + "\"\\s*:\\s*([0-9.eE+-]+)")))
        << ContractName(c);
    EXPECT_EQ(std::stod(f[1]), ContractFactor(c)) << ContractName(c);
  }
}

}  // namespace
}  // namespace ks
