// Tests of the reference bridge (evaluator/problem.h): the reference data it
// prepares (judging sets, distribution-shifted sets, shape variants) and
// KernelBench's constructs. They run the bridge with a real python3 + torch
// (CPU is enough); without one they skip, saying why.
#include "tests/evaluator/problem_test_util.h"

namespace ks {
namespace {

// ---- Reference data --------------------------------------------------------------------

TEST(ReferenceTest, CpuSetsHaveRightSizesDifferAndMatchTheOperator) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_FALSE(d->from_cache);
  EXPECT_EQ(d->device, "cpu");
  EXPECT_FALSE(d->eager.has_value());
  EXPECT_TRUE(d->warnings.empty()) << d->warnings.front();
  ASSERT_EQ(d->JudgingSets(), 2);
  ASSERT_EQ(d->sets.size(), 6u);  // and one distribution-shifted set per transform (ShiftedSetsTest)
  EXPECT_EQ(d->sets[0].seed, 43u);
  EXPECT_EQ(d->sets[1].seed, 44u);
  EXPECT_THAT(d->dir, HasSubstr(cache.string()));
  EXPECT_TRUE(fs::exists(fs::path(d->dir) / "manifest.json"));

  for (int set = 0; set < 2; ++set) {
    for (const char* name : {"A", "B", "out"}) {
      auto p = d->FilePath(set, name);
      ASSERT_TRUE(p.ok()) << p.status().message();
      EXPECT_EQ(static_cast<int64_t>(fs::file_size(*p)), d->signature.Find(name)->bytes()) << name;
    }
    // The bytes are the operator's answer: recompute A @ B here.
    std::vector<float> a = ReadFloats(*d, set, "A"), b = ReadFloats(*d, set, "B"), out = ReadFloats(*d, set, "out");
    ASSERT_EQ(out.size(), 64u * 48u);
    double worst = 0;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 48; ++j) {
        double acc = 0;
        for (int k = 0; k < 32; ++k) acc += double(a[i * 32 + k]) * b[k * 48 + j];
        worst = std::max(worst, std::abs(acc - out[i * 48 + j]));
      }
    EXPECT_LT(worst, 1e-4) << "set " << set;
  }
  EXPECT_NE(ReadFloats(*d, 0, "A"), ReadFloats(*d, 1, "A"));
  EXPECT_NE(ReadFloats(*d, 0, "out"), ReadFloats(*d, 1, "out"));
  EXPECT_FALSE(d->FilePath(6, "A").ok());
  EXPECT_FALSE(d->FilePath(0, "nope").ok());
}

// ---- Distribution-shifted input sets (evaluator/reference/transforms.py) ----

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

// out = A @ B in double, for checking a set's reference against its own inputs.
std::vector<float> Matmul(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(64 * 48);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 48; ++j) {
      double acc = 0;
      for (int k = 0; k < 32; ++k) acc += double(a[i * 32 + k]) * b[k * 48 + j];
      out[i * 48 + j] = static_cast<float>(acc);
    }
  return out;
}


template <typename T>
std::vector<T> ReadAs(const ReferenceData& d, int set, const std::string& name) {
  auto path = d.FilePath(set, name);
  KS_CHECK(path.ok());
  auto bytes = ReadTensorFile(*path, *d.signature.Find(name));
  KS_CHECK(bytes.ok());
  std::vector<T> v(bytes->size() / sizeof(T));
  std::memcpy(v.data(), bytes->data(), bytes->size());
  return v;
}

TEST(ShiftedSetsTest, EachTransformOfSetZeroWithPyTorchsOwnOutput) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ(d->transforms.size(), 4u);
  const char* names[] = {"scale_up", "scale_down", "sign_flip", "outliers"};
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(d->transforms[t].name, names[t]);
    ASSERT_EQ(d->transforms[t].set, 2 + t) << d->transforms[t].note;
    EXPECT_EQ(d->sets[2 + t].transform, names[t]);
    EXPECT_EQ(d->sets[2 + t].seed, 43u);  // input set 0, transformed
  }
  const std::vector<float> a0 = ReadFloats(*d, 0, "A"), b0 = ReadFloats(*d, 0, "B");
  auto scaled = [](std::vector<float> v, float f) {
    for (float& x : v) x *= f;
    return v;
  };
  EXPECT_EQ(ReadFloats(*d, 2, "A"), scaled(a0, 1e5f));
  EXPECT_EQ(ReadFloats(*d, 3, "B"), scaled(b0, 1e-5f));
  EXPECT_EQ(ReadFloats(*d, 4, "A"), scaled(a0, -1.0f));
  // Outliers: one element in 1024 (at least one), 1000 x the largest magnitude, the sign kept.
  std::vector<float> a5 = ReadFloats(*d, 5, "A");
  double amax = 0;
  for (float x : a0) amax = std::max(amax, double(std::abs(x)));
  int changed = 0;
  for (size_t i = 0; i < a0.size(); ++i)
    if (a5[i] != a0[i]) {
      ++changed;
      EXPECT_NEAR(std::abs(a5[i]), 1000 * amax, 1e-3 * amax);
      EXPECT_EQ(a5[i] < 0, a0[i] < 0);
    }
  EXPECT_GE(changed, 1);
  EXPECT_LE(changed, 2);  // 64 * 32 / 1024
  // Each reference is PyTorch's output on that set's own inputs.
  for (int s = 2; s < 6; ++s) {
    std::vector<float> out = ReadFloats(*d, s, "out"), want = Matmul(ReadFloats(*d, s, "A"), ReadFloats(*d, s, "B"));
    double scale = 0;
    for (float x : want) scale = std::max(scale, double(std::abs(x)));
    EXPECT_LT(MaxAbsDiff(out, want), 1e-5 * scale) << "set " << s;
  }
  EXPECT_TRUE(d->notes.empty()) << d->notes.front();
}

TEST(ShiftedSetsTest, EachShiftedSetMeasuresPyTorchsOwnRounding) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("cancelling_sum.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ(d->transforms.size(), 4u);
  ASSERT_TRUE(d->signature.reference_error.count("out"));
  const ReferenceError set0 = d->signature.reference_error.at("out");
  for (const auto& t : d->transforms) {
    ASSERT_GE(t.set, 2) << t.name << ": " << t.note;
    ASSERT_TRUE(t.reference_error.count("out")) << t.name;
    EXPECT_GT(t.reference_error.at("out").rel_norm, 0) << t.name;
  }
  // At its own scale: x 1e5 inputs, a sum of them, an RMS error about 1e5 times set 0's.
  EXPECT_NEAR(d->transforms[0].reference_error.at("out").rms / set0.rms, 1e5, 2e4);
  // Negated inputs round the same way, bit for bit.
  EXPECT_DOUBLE_EQ(d->transforms[2].reference_error.at("out").rel_norm, set0.rel_norm);
}

TEST(ShiftedSetsTest, ATransformOutsideTheOperatorsDomainIsDroppedWithANote) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("log_positive.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->JudgingSets(), 2);
  ASSERT_EQ(d->transforms.size(), 4u);
  EXPECT_EQ(d->transforms[2].name, "sign_flip");
  EXPECT_EQ(d->transforms[2].set, -1);
  EXPECT_THAT(d->transforms[2].note, HasSubstr("dropped"));
  EXPECT_THAT(d->transforms[2].note, HasSubstr("NaN/Inf"));
  // The others stay (outliers keep the sign, so log stays defined).
  for (int t : {0, 1, 3}) EXPECT_GE(d->transforms[t].set, 2) << d->transforms[t].name << ": " << d->transforms[t].note;
  EXPECT_EQ(d->sets.size(), 5u);
  bool noted = false;
  for (const auto& n : d->notes) noted = noted || n.find("'sign_flip'") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_TRUE(d->warnings.empty()) << d->warnings.front();  // not a degenerate problem
}

TEST(ShiftedSetsTest, TheProblemNarrowsThemAndIntegerInputsStayAsTheyAre) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("scale_only_transforms.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ(d->sets.size(), 3u);
  EXPECT_EQ(d->sets[2].transform, "scale_down");
  for (const auto& t : d->transforms)
    if (t.name != "scale_down") {
      EXPECT_EQ(t.set, -1);
      EXPECT_THAT(t.note, HasSubstr("INPUT_TRANSFORMS"));
    }
  auto y0 = d->FilePath(0, "y"), y2 = d->FilePath(2, "y");
  ASSERT_TRUE(y0.ok() && y2.ok());
  EXPECT_EQ(*ReadFile(*y0), *ReadFile(*y2));

  // INPUT_TRANSFORMS = []: none at all.
  const std::string off = cache.string() + "/transforms_off.py";
  std::string text = *ReadFile(Fixture("scale_only_transforms.py"));
  text.replace(text.find("[\"scale_down\"]"), 14, "[]");
  ASSERT_TRUE(WriteFile(off, text).ok());
  auto none = PrepareReference(off, CpuOptions(cache.string()));
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(none->sets.size(), 2u);
  ASSERT_EQ(none->transforms.size(), 4u);
  for (const auto& t : none->transforms) EXPECT_EQ(t.set, -1);
}

TEST(ShiftedSetsTest, AShiftedSetCarriesItsOwnTransformedWeights) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("linear_weights.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ(d->sets.size(), 6u);
  for (int s = 0; s < d->JudgingSets(); ++s) EXPECT_TRUE(d->sets[s].own_parameters.empty());
  for (const auto& t : d->transforms) {
    ASSERT_GE(t.set, 2) << t.name << ": " << t.note;
    EXPECT_EQ(t.parameters, std::vector<std::string>{"weight"}) << t.name;
    EXPECT_THAT(t.note, HasSubstr("parameters likewise (weight)"));
    const ReferenceSet& set = d->sets[t.set];
    EXPECT_TRUE(set.OwnsParameter("weight"));
    EXPECT_NE(set.files.at("weight"), d->sets[0].files.at("weight")) << "its own file";
  }
  // scale_up's weights are set 0's x 1e5.
  auto w0 = ReadFile(d->sets[0].files.at("weight")), w_up = ReadFile(d->sets[d->transforms[0].set].files.at("weight"));
  ASSERT_TRUE(w0.ok() && w_up.ok());
  ASSERT_EQ(w0->size(), w_up->size());
  const float* a = reinterpret_cast<const float*>(w0->data());
  const float* b = reinterpret_cast<const float*>(w_up->data());
  for (size_t i = 0; i < w0->size() / 4; i += 97) EXPECT_FLOAT_EQ(b[i], a[i] * 1e5f) << i;

  // PARAMETER_TRANSFORMS = []: the weights are every set's one copy.
  const std::string inputs_only = cache.string() + "/linear_weights_inputs_only.py";
  ASSERT_TRUE(WriteFile(inputs_only, *ReadFile(Fixture("linear_weights.py")) + "\nPARAMETER_TRANSFORMS = []\n").ok());
  auto kept = PrepareReference(inputs_only, CpuOptions(cache.string()));
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  for (const auto& set : kept->sets) EXPECT_TRUE(set.own_parameters.empty());
  for (const auto& t : kept->transforms) EXPECT_THAT(t.note, HasSubstr("PARAMETER_TRANSFORMS"));
}

TEST(ShapeVariantsTest, EachDeclaredShapeGetsAReferenceOfItsOwn) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("rowsum_shapes.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->signature.inputs[0].shape, (std::vector<int64_t>{64, 256}));
  ASSERT_EQ(d->shape_variant_count, 2);
  ASSERT_EQ(d->shape_variants.size(), 2u);
  const ReferenceData& a = d->shape_variants[0];
  const ReferenceData& b = d->shape_variants[1];
  EXPECT_EQ(a.signature.inputs[0].shape, (std::vector<int64_t>{7, 1000}));
  EXPECT_EQ(a.signature.outputs[0].shape, (std::vector<int64_t>{7}));
  EXPECT_EQ(b.signature.inputs[0].shape, (std::vector<int64_t>{130, 33}));
  EXPECT_EQ(ShapeVariantName(b), "at x [130, 33]");
  for (const ReferenceData* v : {&a, &b}) {
    EXPECT_EQ(v->sets.size(), 2u);  // two sets, no distribution-shifted ones, untimed
    EXPECT_EQ(v->JudgingSets(), 2);
    EXPECT_TRUE(v->shape_variants.empty());
    // The reference is the operator at that shape: row sums of the set's own x.
    const auto& in = v->signature.inputs[0].shape;
    std::vector<float> x = ReadFloats(*v, 1, "x"), out = ReadFloats(*v, 1, "out");
    ASSERT_EQ(out.size(), static_cast<size_t>(in[0]));
    for (int64_t r = 0; r < in[0]; ++r) {
      double acc = 0;
      for (int64_t c = 0; c < in[1]; ++c) acc += x[r * in[1] + c];
      EXPECT_NEAR(out[r], acc, 1e-4) << r;
    }
  }
  // A KernelBench-style problem declares none.
  auto one = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->shape_variant_count, 0);
  EXPECT_TRUE(one->shape_variants.empty());
}

TEST(ShapeVariantsTest, AVariantWithOtherDtypesIsRefusedNamingIt) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  const std::string bad = cache.string() + "/bad_variant.py";
  std::string text = *ReadFile(Fixture("rowsum_shapes.py"));
  text.replace(text.find("torch.randn(130, 33)"), 20, "torch.randn(130, 33).double()");
  ASSERT_TRUE(WriteFile(bad, text).ok());
  auto d = PrepareReference(bad, CpuOptions(cache.string()));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("get_inputs_variants()[1]"));
}

TEST(ShiftedSetsTest, NoRoomLeavesThemOutButKeepsTheJudgingSets) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string(), 2);
  constexpr uint64_t kSet = (64 * 32 + 32 * 48 + 64 * 48) * 4;
  o.cache_cap = 3 * kSet + kSet / 2;  // two judging sets and one shifted one
  auto d = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->JudgingSets(), 2);
  ASSERT_EQ(d->sets.size(), 3u);
  EXPECT_EQ(d->sets[2].transform, "scale_up");
  EXPECT_THAT(d->transforms[1].note, HasSubstr("no room"));

  // Three judging sets asked for where three sets fit in all: the third makes way for a shifted one.
  o.sets = 3;
  auto shared = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(shared.ok()) << shared.status().message();
  EXPECT_EQ(shared->JudgingSets(), 2);
  ASSERT_EQ(shared->sets.size(), 3u);
  EXPECT_EQ(shared->sets[2].transform, "scale_up");
  ASSERT_FALSE(shared->warnings.empty());
  EXPECT_THAT(shared->warnings[0], HasSubstr("using 2 of the 3 input sets asked for (and 1 distribution-shifted"));
}

TEST(ReferenceTest, ParametersAreSharedAndSeeded) {
  KS_REQUIRE_TORCH();
  TempDir cache1, cache2;
  auto d = PrepareReference(Fixture("conv_params.py"), CpuOptions(cache1.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(*d->FilePath(0, "conv.weight"), *d->FilePath(1, "conv.weight"));
  EXPECT_NE(*d->FilePath(0, "x"), *d->FilePath(1, "x"));
  // The same seed reproduces the weights bit for bit; another seed does not.
  auto same = PrepareReference(Fixture("conv_params.py"), CpuOptions(cache2.string()));
  ASSERT_TRUE(same.ok()) << same.status().message();
  EXPECT_FALSE(same->from_cache);
  EXPECT_EQ(ReadFloats(*d, 0, "conv.weight"), ReadFloats(*same, 0, "conv.weight"));
  EXPECT_EQ(ReadFloats(*d, 1, "x"), ReadFloats(*same, 1, "x"));
  auto other = PrepareReference(Fixture("conv_params.py"), CpuOptions(cache2.string(), 2, 7));
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_NE(ReadFloats(*d, 0, "conv.weight"), ReadFloats(*other, 0, "conv.weight"));
  EXPECT_NE(d->dir, other->dir);
}

TEST(ReferenceTest, CompleteEntriesAreReusedAndDamagedOnesRecomputed) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto first = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto second = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_TRUE(second->from_cache);
  EXPECT_EQ(second->dir, first->dir);

  // A truncated tensor file must not be served from the cache.
  std::string out_path = *first->FilePath(0, "out");
  fs::resize_file(out_path, 100);
  EXPECT_FALSE(LoadReferenceDir(first->dir).ok());
  auto third = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_FALSE(third->from_cache);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(*third->FilePath(0, "out"))), 64 * 48 * 4);

  // No temporary directories are left behind.
  for (const auto& e : fs::directory_iterator(cache.string()))
    EXPECT_THAT(e.path().filename().string(), Not(HasSubstr(".tmp"))) << e.path();
}

TEST(ReferenceTest, ScalarsAndBfloat16) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("scalar_input.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ(d->scalars.size(), 2u);
  EXPECT_DOUBLE_EQ(d->scalars.at("alpha"), 0.5);
  EXPECT_DOUBLE_EQ(d->scalars.at("k"), 3);
  EXPECT_FALSE(d->FilePath(0, "alpha").ok());  // scalars live in the manifest, not in files
  EXPECT_EQ(fs::file_size(*d->FilePath(0, "x")), 8u * 8u * 2u);
  EXPECT_EQ(fs::file_size(*d->FilePath(0, "out")), 8u * 8u * 2u);
}

TEST(ReferenceTest, BadProblemIsInvalidArgumentAndLeavesNoEntry) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto d = PrepareReference(Fixture("bad_forward_raises.py"), CpuOptions(cache.string()));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("forward() raised"));
  EXPECT_TRUE(fs::is_empty(cache.string()));
}

TEST(ReferenceGpuTest, CudaReferenceIsTimedEagerAndCompiled) {
  KS_REQUIRE_TORCH();
  auto py = ResolvePython();
  if (!py->cuda) GTEST_SKIP() << py->python << " (torch " << py->torch_version << ") sees no CUDA device";
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string());
  o.device = "cuda";
  o.time = true;
  auto d = PrepareReference(Fixture("conv_params.py"), o);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->device, py->device);
  ASSERT_TRUE(d->eager.has_value());
  EXPECT_GE(d->eager->runs, 10);
  EXPECT_LE(d->eager->runs, 200);
  EXPECT_GT(d->eager->median_ms, 0);
  EXPECT_LE(d->eager->min_ms, d->eager->median_ms);
  // Either torch.compile was timed, or a warning says why not.
  if (!d->compiled) {
    EXPECT_THAT(d->warnings, ::testing::Contains(HasSubstr("torch.compile")));
  }
  // An untimed request is served by the timed entry.
  o.time = false;
  auto again = PrepareReference(Fixture("conv_params.py"), o);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE(again->from_cache);
  EXPECT_EQ(again->dir, d->dir);
}

// ---- KernelBench constructs ---------------------------------------------------------------
TEST(ConstructsTest, BoolIntegerZeroDimAndTupleOutputsAreReferencedExactly) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto r = PrepareReference(Fixture("mixed_kinds.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Signature& sig = r->signature;
  ASSERT_EQ(sig.inputs.size(), 3u);
  EXPECT_EQ(sig.inputs[1].dtype, DType::kBool);
  EXPECT_EQ(sig.inputs[2].dtype, DType::kInt32);
  ASSERT_EQ(sig.outputs.size(), 3u);
  EXPECT_EQ(sig.outputs[0].dtype, DType::kInt64);
  EXPECT_EQ(sig.outputs[1].dtype, DType::kFloat32);
  EXPECT_TRUE(sig.outputs[1].shape.empty());
  EXPECT_EQ(sig.outputs[1].bytes(), 4);
  for (int set = 0; set < 2; ++set) {
    auto x = ReadAs<float>(*r, set, "x");
    auto mask = ReadAs<uint8_t>(*r, set, "mask");
    auto labels = ReadAs<int32_t>(*r, set, "labels");
    auto argmax = ReadAs<int64_t>(*r, set, "out0");
    auto loss = ReadAs<float>(*r, set, "out1");
    auto twice = ReadAs<int32_t>(*r, set, "out2");
    double sum = 0;
    for (int i = 0; i < 16; ++i) {
      int best = 0;
      float best_v = -INFINITY;
      for (int j = 0; j < 10; ++j) {
        float y = (mask[i * 10 + j] ? 0.f : x[i * 10 + j]) + float(labels[i]);
        sum += std::max(0.0, 1.0 - y * 0.1);
        if (y > best_v) best_v = y, best = j;
      }
      EXPECT_EQ(argmax[i], best) << "set " << set << " row " << i;
      EXPECT_EQ(twice[i], 2 * labels[i]);
    }
    EXPECT_NEAR(loss[0], sum / 160, 1e-5);
  }
}

// BatchNorm in training mode updates its running statistics, and this module
// also counts its calls in a buffer that scales the output: without the
// pre-forward state restored, set 1 would be scaled by 2 (or 3, after the
// determinism check) and the candidate would get post-forward buffers.
TEST(ConstructsTest, EverySetAndTheCandidateStartFromThePreForwardState) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto r = PrepareReference(Fixture("stateful_buffer.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(ReadAs<float>(*r, 0, "calls"), std::vector<float>{0.f});
  EXPECT_EQ(ReadAs<float>(*r, 0, "bn.running_mean"), std::vector<float>(6, 0.f));
  EXPECT_EQ(ReadAs<float>(*r, 0, "bn.running_var"), std::vector<float>(6, 1.f));
  EXPECT_EQ(ReadAs<int64_t>(*r, 0, "bn.num_batches_tracked"), std::vector<int64_t>{0});
  for (int set = 0; set < 2; ++set) {
    auto x = ReadAs<float>(*r, set, "x");
    auto out = ReadAs<float>(*r, set, "out");
    for (int c = 0; c < 6; ++c) {  // training-mode BatchNorm: batch mean, biased variance; weight 1, bias 0
      double mean = 0, var = 0;
      for (int n = 0; n < 5; ++n) mean += x[n * 6 + c] / 5.0;
      for (int n = 0; n < 5; ++n) var += (x[n * 6 + c] - mean) * (x[n * 6 + c] - mean) / 5.0;
      for (int n = 0; n < 5; ++n)
        EXPECT_NEAR(out[n * 6 + c], (x[n * 6 + c] - mean) / std::sqrt(var + 1e-5) * 1.0, 1e-4)
            << "set " << set << " (a scale of 2 or more means the buffer kept the previous forward's count)";
    }
  }
}

TEST(ConstructsTest, NondeterministicReferencesAreRefusedNamingTheCause) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto dropout = PrepareReference(Fixture("nondet_dropout.py"), CpuOptions(cache.string()));
  ASSERT_FALSE(dropout.ok());
  EXPECT_EQ(dropout.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(dropout.status().message(), HasSubstr("nondet_dropout.py"));
  EXPECT_THAT(dropout.status().message(), HasSubstr("not deterministic"));
  EXPECT_THAT(dropout.status().message(), HasSubstr("Dropout in training mode (drop)"));
  auto rand = CheckProblem(Fixture("nondet_rand.py"), {}, "cpu");
  ASSERT_FALSE(rand.ok());
  EXPECT_THAT(rand.status().message(), HasSubstr("forward draws random numbers"));
  // A refused problem leaves nothing in the cache.
  auto usage = ReadCacheUsage(cache.string());
  ASSERT_TRUE(usage.ok());
  EXPECT_TRUE(usage->entries.empty());
  EXPECT_EQ(usage->temp_dirs, 0);
}

}  // namespace
}  // namespace ks
