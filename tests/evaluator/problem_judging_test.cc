// Tests of what the reference bridge measures for judging (evaluator/problem.h):
// degenerate references, tolerances and PyTorch's own float32 rounding. They
// run the bridge with a real python3 + torch (CPU is enough); without one
// they skip, saying why.
#include "tests/evaluator/problem_test_util.h"

namespace ks {
namespace {

// ---- Degenerate references ----------------------------------------------------------------

TEST(DegenerateTest, AllZerosOutputIsFlagged) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("all_zeros.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_FALSE(d->warnings.empty());
  EXPECT_THAT(d->warnings[0], HasSubstr("'out'"));
  EXPECT_THAT(d->warnings[0], HasSubstr("all zeros"));

  auto w = CheckProblem(Fixture("all_zeros.py"));
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_THAT(*w, ::testing::Contains(HasSubstr("all zeros")));
  EXPECT_THAT(*w, ::testing::Contains(HasSubstr("identical")));
}

TEST(DegenerateTest, ConstantOutputIsFlaggedAndAGoodProblemIsNot) {
  KS_REQUIRE_TORCH();
  auto c = CheckProblem(Fixture("noisy_constant.py"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_THAT(*c, ::testing::Contains(HasSubstr("constant")));
  auto good = CheckProblem(Fixture("two_outputs.py"));
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_TRUE(good->empty()) << good->front();
}

// Issue 14, item 4: outputs the element-wise tolerance barely tests are noted,
// with the share, but not refused (the norm rules still judge them).
TEST(DegenerateTest, NearDegenerateOutputsAreNotedWithTheShare) {
  KS_REQUIRE_TORCH();
  std::vector<std::string> notes;
  auto small = CheckProblem(Fixture("mostly_small.py"), {}, "auto", 42, &notes);
  ASSERT_TRUE(small.ok()) << small.status().message();
  EXPECT_TRUE(small->empty()) << small->front();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], ::testing::ContainsRegex("output 'out': 9[0-9]\\.[0-9]% of elements are within the "
                                                 "element-wise tolerance of zero"));
  notes.clear();
  auto flat = CheckProblem(Fixture("almost_constant.py"), {}, "auto", 42, &notes);
  ASSERT_TRUE(flat.ok()) << flat.status().message();
  EXPECT_TRUE(flat->empty()) << flat->front();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("output 'out' is almost constant (std / RMS = 0.001"));
  notes.clear();
  auto good = CheckProblem(Fixture("two_outputs.py"), {}, "auto", 42, &notes);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(notes.empty()) << notes.front();
}

TEST(ToleranceTest, NormBoundsPerDtypeAndAProblemsLooserRtolLoosensThem) {
  Signature s;
  Tolerance f32 = s.ToleranceFor(DType::kFloat32);
  EXPECT_DOUBLE_EQ(f32.atol, 1e-4);
  EXPECT_DOUBLE_EQ(f32.rel_norm, 1e-5);
  EXPECT_DOUBLE_EQ(f32.large_rel, 1e-3);
  EXPECT_DOUBLE_EQ(f32.large_share, 1e-3);
  EXPECT_GT(s.ToleranceFor(DType::kBFloat16).rel_norm, s.ToleranceFor(DType::kFloat16).rel_norm);
  EXPECT_GT(s.ToleranceFor(DType::kFloat16).rel_norm, f32.rel_norm);
  EXPECT_EQ(s.ToleranceFor(DType::kInt64).rel_norm, 0);  // exact
  // "Tiny" sits where an honest kernel's error could look large: 2% of the
  // RMS for fp32, 10% for bf16 (whose rounding alone is ~0.5% of the RMS).
  EXPECT_DOUBLE_EQ(f32.TinyFraction(), 0.02);
  EXPECT_DOUBLE_EQ(s.ToleranceFor(DType::kBFloat16).TinyFraction(), 0.1);
  // A TF32 reference's TOLERANCE (conv problems): the bounds follow its rtol.
  s.tolerance = Tolerance{5e-3, 5e-3};
  Tolerance conv = s.ToleranceFor(DType::kFloat32);
  EXPECT_DOUBLE_EQ(conv.atol, 5e-3);
  EXPECT_DOUBLE_EQ(conv.rel_norm, 1.25e-3);
  EXPECT_DOUBLE_EQ(conv.large_rel, 5e-2);
  // A tighter TOLERANCE keeps the dtype's norm bounds; named bounds win.
  s.tolerance = Tolerance{1e-6, 1e-6};
  EXPECT_DOUBLE_EQ(s.ToleranceFor(DType::kFloat32).rel_norm, 1e-5);
  s.tolerance = Tolerance{1e-4, 1e-4, 3e-6, 0, 0.01};
  EXPECT_DOUBLE_EQ(s.ToleranceFor(DType::kFloat32).rel_norm, 3e-6);
  EXPECT_DOUBLE_EQ(s.ToleranceFor(DType::kFloat32).large_share, 0.01);
  // And they survive the signature's JSON.
  auto back = SignatureFromJson([&] {
    Signature t = s;
    t.outputs.push_back(TensorSpec{});
    t.outputs[0].name = "out";
    return SignatureToJson(t);
  }());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_DOUBLE_EQ(back->ToleranceFor(DType::kFloat32).rel_norm, 3e-6);
}

// ---- Tolerance widened by PyTorch's own float32 rounding --------------------------------

// x rounded to the nearest float16 / bfloat16 (ties to even), back in float:
// what a kernel computing in that precision starts from.
float RoundToHalf(float x) { return static_cast<float>(static_cast<_Float16>(x)); }
float RoundToBfloat16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &b, 4);
  return x;
}

// Row sums the way a GPU block of 256 threads does it: each thread sums a
// strided slice in float32, then a tree over the threads. An honest float32
// order, different from PyTorch's.
std::vector<double> BlockRowSums(const std::vector<float>& x, int rows, int n, float (*round)(float) = nullptr) {
  std::vector<double> out(rows);
  for (int r = 0; r < rows; ++r) {
    std::vector<float> lane(256, 0.f);
    for (int j = 0; j < n; ++j) {
      float v = x[size_t(r) * n + j];
      lane[j % 256] += round ? round(v) : v;
    }
    for (int w = 128; w > 0; w /= 2)
      for (int t = 0; t < w; ++t) lane[t] += lane[t + w];
    out[r] = lane[0];
  }
  return out;
}

std::vector<double> AsDoubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

TEST(RoundingTest, CancellingSumHonestOtherOrderPassesOnlyWithTheMeasuredRounding) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("cancelling_sum.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  const TensorSpec* out = d->signature.Find("out");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(d->signature.reference_error.count("out"), 1u) << (d->notes.empty() ? "" : d->notes.front());
  const ReferenceError e = d->signature.reference_error.at("out");
  // Pairs of +-1000 cancel down to ~100: float32 keeps about 1e-4 of it.
  EXPECT_GT(e.rel_norm, 1e-5);
  EXPECT_LT(e.rel_norm, kMaxRoundingRelNorm);
  EXPECT_GT(e.rms, 1e-3);
  const Tolerance plain = d->signature.ToleranceFor(DType::kFloat32), widened = d->signature.ToleranceFor(*out);
  EXPECT_DOUBLE_EQ(widened.atol, plain.atol + kRoundingFactor * e.rms);
  EXPECT_DOUBLE_EQ(widened.rtol, plain.rtol);
  EXPECT_THAT(d->signature.DescribeTolerance(*out), HasSubstr("x PyTorch's own float32 error"));
  for (int set = 0; set < 2; ++set) {
    const std::vector<float> x = ReadFloats(*d, set, "x");
    const std::vector<double> ref = AsDoubles(ReadFloats(*d, set, "out"));
    ASSERT_EQ(x.size(), size_t(64) << 16);
    const std::vector<double> honest = BlockRowSums(x, 64, 1 << 16);
    // The default float32 tolerance refuses an honest kernel here (the gap this closes) ...
    EXPECT_GT(CompareOnHost(plain, honest, ref).mismatches, 0) << "set " << set;
    // ... the widened one accepts it ...
    HostComparison ok = CompareOnHost(widened, honest, ref);
    EXPECT_TRUE(ok.passes) << "set " << set << ": " << ok.mismatches << " mismatches, rel_norm " << ok.rel_norm;
    // ... and still refuses the same sum over float16 or bfloat16 inputs.
    for (auto round : {&RoundToHalf, &RoundToBfloat16}) {
      HostComparison low = CompareOnHost(widened, BlockRowSums(x, 64, 1 << 16, round), ref);
      EXPECT_FALSE(low.passes) << "set " << set;
      EXPECT_GT(low.rel_norm, widened.rel_norm) << "set " << set;
    }
  }
  // Kept with the reference: a cached entry has it too.
  auto again = PrepareReference(Fixture("cancelling_sum.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE(again->from_cache);
  ASSERT_EQ(again->signature.reference_error.count("out"), 1u);
  EXPECT_DOUBLE_EQ(again->signature.reference_error.at("out").rms, e.rms);
}

// A = 64x32 @ 32x48, one product per element in float32 with `round` applied to the inputs.
std::vector<double> MatmulWith(const std::vector<float>& a, const std::vector<float>& b, float (*round)(float),
                               bool reverse) {
  std::vector<double> out(64 * 48);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 48; ++j) {
      float acc = 0;
      for (int s = 0; s < 32; ++s) {
        int k = reverse ? 31 - s : s;
        float x = a[i * 32 + k], y = b[k * 48 + j];
        acc = std::fma(round ? round(x) : x, round ? round(y) : y, acc);
      }
      out[i * 48 + j] = acc;
    }
  return out;
}

TEST(RoundingTest, LowerPrecisionStillFailsOnAnOrdinaryProblem) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  const TensorSpec* out = d->signature.Find("out");
  ASSERT_EQ(d->signature.reference_error.count("out"), 1u);
  // A short, well-conditioned sum: float32 is accurate to ~1e-7, and the
  // widening changes nothing that matters.
  EXPECT_LT(d->signature.reference_error.at("out").rel_norm, 1e-6);
  const Tolerance widened = d->signature.ToleranceFor(*out);
  EXPECT_LT(widened.atol, 2e-4);
  EXPECT_DOUBLE_EQ(widened.rel_norm, d->signature.ToleranceFor(DType::kFloat32).rel_norm);
  const std::vector<float> a = ReadFloats(*d, 0, "A"), b = ReadFloats(*d, 0, "B");
  const std::vector<double> ref = AsDoubles(ReadFloats(*d, 0, "out"));
  HostComparison honest = CompareOnHost(widened, MatmulWith(a, b, nullptr, /*reverse=*/true), ref);
  EXPECT_TRUE(honest.passes) << honest.mismatches << " mismatches, rel_norm " << honest.rel_norm;
  for (auto round : {&RoundToHalf, &RoundToBfloat16}) {
    HostComparison low = CompareOnHost(widened, MatmulWith(a, b, round, false), ref);
    EXPECT_FALSE(low.passes);
    EXPECT_GT(low.rel_norm, 10 * widened.rel_norm);
  }
}

TEST(RoundingTest, WideningRuleAndItsLimits) {
  const Tolerance base = DefaultTolerance(DType::kFloat32);
  // Rounding far below the defaults leaves the norm bounds as they are.
  Tolerance t = WidenForRounding(base, {1e-9, 1e-8});
  EXPECT_DOUBLE_EQ(t.rel_norm, base.rel_norm);
  EXPECT_DOUBLE_EQ(t.large_rel, base.large_rel);
  EXPECT_DOUBLE_EQ(t.atol, base.atol + kRoundingFactor * 1e-9);
  // Larger rounding raises them, keeping "tiny" at most 10% of the RMS.
  t = WidenForRounding(base, {0.03, 2.5e-4});
  EXPECT_DOUBLE_EQ(t.rel_norm, kRoundingFactor * 2.5e-4);
  EXPECT_DOUBLE_EQ(t.large_rel, 20 * kRoundingFactor * 2.5e-4);
  EXPECT_LE(t.TinyFraction(), 0.1);
  // Beyond float32 rounding (the float64 run took another branch): nothing.
  t = WidenForRounding(base, {5.0, 2e-2});
  EXPECT_DOUBLE_EQ(t.atol, base.atol);
  EXPECT_DOUBLE_EQ(t.rel_norm, base.rel_norm);
  // Exact dtypes are never widened; other dtypes and unmeasured outputs neither.
  EXPECT_DOUBLE_EQ(WidenForRounding(DefaultTolerance(DType::kInt32), {1, 1e-4}).atol, 0);
  Signature s;
  TensorSpec f32, f16;
  f32.name = "out0";
  f16.name = "out1";
  f16.dtype = DType::kFloat16;
  s.outputs = {f32, f16};
  EXPECT_DOUBLE_EQ(s.ToleranceFor(f32).atol, base.atol);
  s.reference_error["out0"] = {1e-3, 1e-5};
  s.reference_error["out1"] = {1e-3, 1e-5};
  EXPECT_DOUBLE_EQ(s.ToleranceFor(f32).atol, base.atol + kRoundingFactor * 1e-3);
  EXPECT_DOUBLE_EQ(s.ToleranceFor(f16).atol, DefaultTolerance(DType::kFloat16).atol);
  // And it survives the signature's JSON.
  auto back = SignatureFromJson(SignatureToJson(s));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_DOUBLE_EQ(back->ToleranceFor(f32).atol, s.ToleranceFor(f32).atol);
  nlohmann::json bad = SignatureToJson(s);
  bad["reference_error"]["out0"] = {{"rms", "x"}};
  EXPECT_FALSE(SignatureFromJson(bad).ok());
}

TEST(RoundingTest, Float64RunThatFailsIsANoteNotAnError) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  // forward casts to float32 itself: no float64 result to compare with.
  auto d = PrepareReference(Fixture("noisy_constant.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_TRUE(d->signature.reference_error.empty());
  EXPECT_THAT(::testing::PrintToString(d->notes), HasSubstr("PyTorch's output is its reference"));
  // forward raises in float64 (an op without a float64 kernel).
  auto f = PrepareReference(Fixture("float32_only.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->signature.reference_error.empty());
  EXPECT_THAT(::testing::PrintToString(f->notes), HasSubstr("failed (TypeError: float32 only)"));
  EXPECT_DOUBLE_EQ(f->signature.ToleranceFor(*f->signature.Find("out")).atol, 1e-4);
}

}  // namespace
}  // namespace ks
