// Tests of the reference bridge through its C++ API (evaluator/problem.h) and
// through the real `kernelsearch problem` binary. They run the bridge with a
// real python3 + torch (CPU is enough); without one they skip, saying why.
#include "evaluator/bridge_internal.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/problem.h"
#include "evaluator/reference_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "tests/testing/paths.h"
#include "tests/testing/skip.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ks::testing::TempDir;
using ::testing::Not;

const std::string kFixtures = ks::testing::SourcePath("tests/evaluator/fixtures/");

std::string Fixture(const std::string& name) { return kFixtures + name; }

std::vector<float> ReadFloats(const ReferenceData& d, int set, const std::string& name) {
  auto path = d.FilePath(set, name);
  KS_CHECK(path.ok());
  const TensorSpec* spec = d.signature.Find(name);
  KS_CHECK(spec != nullptr);
  auto bytes = ReadTensorFile(*path, *spec);
  KS_CHECK(bytes.ok());
  std::vector<float> v(bytes->size() / sizeof(float));
  std::memcpy(v.data(), bytes->data(), bytes->size());
  return v;
}

// ---- Data files and python --------------------------------------------------------

TEST(DataFileTest, FindsTheBridgeInTheSourceTree) {
  unsetenv("KS_DATA_DIR");
  auto p = FindDataFile("reference/bridge.py");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_THAT(*p, HasSubstr("evaluator/reference/bridge.py"));
  EXPECT_TRUE(fs::is_regular_file(*p));
}

TEST(DataFileTest, KsDataDirIsTheOnlyPlaceLookedAtWhenSet) {
  TempDir dir;
  fs::create_directories(fs::path(dir.string()) / "reference");
  ASSERT_TRUE(WriteFile(dir.string() + "/reference/bridge.py", "# stand-in\n").ok());
  setenv("KS_DATA_DIR", dir.string().c_str(), 1);
  auto found = FindDataFile("reference/bridge.py");
  auto missing = FindDataFile("reference/timing.py");
  unsetenv("KS_DATA_DIR");
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(*found, dir.string() + "/reference/bridge.py");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.string() + "/reference/timing.py"));
}

TEST(PythonTest, ExplicitInterpreterWithoutTorchIsAnEnvironmentError) {
  auto r = ResolvePython("/bin/false");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("/bin/false"));
  EXPECT_THAT(r.status().message(), HasSubstr("torch"));
}

TEST(PythonTest, ResolvedInterpreterImportsTorch) {
  KS_REQUIRE_TORCH();
  auto r = ResolvePython();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->torch_version.empty());
  EXPECT_FALSE(r->device.empty());
  // The cached answer is the same object of facts.
  auto again = ResolvePython();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->python, r->python);
}

// probe.py --quick (the cache key's facts without importing torch) agrees
// with the probe that imports torch: the same device, CUDA or not, and the
// same torch release.
TEST(PythonTest, QuickProbeAgreesWithTorch) {
  KS_REQUIRE_TORCH();
  auto full = ResolvePython();
  ASSERT_TRUE(full.ok());
  auto script = FindDataFile("reference/probe.py");
  ASSERT_TRUE(script.ok());
  SubprocessOptions o;
  o.argv = {full->python, *script, "--quick"};
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok() && r->Succeeded()) << (r.ok() ? r->err : r.status().message());
  nlohmann::json j = nlohmann::json::parse(r->out);
  EXPECT_EQ(j.value("cuda", !full->cuda), full->cuda);
  EXPECT_EQ(j.value("device", ""), full->device);
  const std::string quick_version = j.value("torch", "");
  // "2.11.0+cu128" both ways from a wheel; a distribution's build may add a local tag ("1.13.0a0+gitunknown").
  const std::string release = full->torch_version.substr(0, full->torch_version.find('+'));
  EXPECT_EQ(quick_version.substr(0, quick_version.find('+')), release);
  o.argv = {"/bin/false", *script, "--quick"};
  auto none = RunSubprocess(o);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->Succeeded());
}

// ---- Signatures ---------------------------------------------------------------------

TEST(SignatureTest, MatmulWithMetadata) {
  KS_REQUIRE_TORCH();
  auto s = LoadProblemSignature(Fixture("matmul.py"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->name, "matmul");
  EXPECT_EQ(s->file, Fixture("matmul.py"));
  EXPECT_EQ(s->description, "C = A @ B for a 64x32 and a 32x48 matrix");
  ASSERT_TRUE(s->tolerance.has_value());
  EXPECT_DOUBLE_EQ(s->tolerance->atol, 1e-4);
  ASSERT_TRUE(s->flops.has_value());
  EXPECT_DOUBLE_EQ(*s->flops, 2.0 * 64 * 32 * 48);
  ASSERT_EQ(s->inputs.size(), 2u);
  EXPECT_EQ(s->inputs[0].name, "A");
  EXPECT_EQ(s->inputs[0].shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(s->inputs[0].strides, (std::vector<int64_t>{32, 1}));
  EXPECT_EQ(s->inputs[1].name, "B");
  EXPECT_EQ(s->inputs[1].shape, (std::vector<int64_t>{32, 48}));
  EXPECT_TRUE(s->parameters.empty());
  ASSERT_EQ(s->outputs.size(), 1u);
  EXPECT_EQ(s->outputs[0].name, "out");
  EXPECT_EQ(s->outputs[0].dtype, DType::kFloat32);
  EXPECT_EQ(s->outputs[0].shape, (std::vector<int64_t>{64, 48}));
}

TEST(SignatureTest, ParametersAndBuffersByStateDictKey) {
  KS_REQUIRE_TORCH();
  auto s = LoadProblemSignature(Fixture("conv_params.py"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_FALSE(s->tolerance.has_value());
  EXPECT_FALSE(s->flops.has_value());
  ASSERT_EQ(s->inputs.size(), 1u);
  EXPECT_EQ(s->inputs[0].name, "x");
  std::vector<std::string> names;
  for (const auto& p : s->parameters) names.push_back(p.name);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("conv.weight", "conv.bias", "scale", "shift"));
  const TensorSpec* w = s->Find("conv.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{8, 3, 3, 3}));
  EXPECT_EQ(w->strides, (std::vector<int64_t>{27, 9, 3, 1}));
  ASSERT_EQ(s->outputs.size(), 1u);
  EXPECT_EQ(s->outputs[0].shape, (std::vector<int64_t>{2, 8, 14, 14}));
}

TEST(SignatureTest, TupleOutputsAreNumbered) {
  KS_REQUIRE_TORCH();
  auto s = LoadProblemSignature(Fixture("two_outputs.py"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->outputs.size(), 2u);
  EXPECT_EQ(s->outputs[0].name, "out0");
  EXPECT_EQ(s->outputs[0].dtype, DType::kFloat32);
  EXPECT_EQ(s->outputs[0].shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(s->outputs[1].name, "out1");
  EXPECT_EQ(s->outputs[1].dtype, DType::kFloat16);
}

TEST(SignatureTest, ScalarInputsCarryTheirValues) {
  KS_REQUIRE_TORCH();
  auto s = LoadProblemSignature(Fixture("scalar_input.py"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->inputs.size(), 3u);
  EXPECT_EQ(s->inputs[0].dtype, DType::kBFloat16);
  EXPECT_FALSE(s->inputs[0].is_scalar);
  EXPECT_EQ(s->inputs[1].name, "alpha");
  EXPECT_TRUE(s->inputs[1].is_scalar);
  EXPECT_EQ(s->inputs[1].dtype, DType::kFloat64);
  EXPECT_DOUBLE_EQ(s->inputs[1].scalar_value, 0.5);
  EXPECT_EQ(s->inputs[2].name, "k");
  EXPECT_EQ(s->inputs[2].dtype, DType::kInt64);
  EXPECT_DOUBLE_EQ(s->inputs[2].scalar_value, 3);
}

TEST(SignatureTest, ProblemPrintsDoNotCorruptTheAnswer) {
  KS_REQUIRE_TORCH();
  auto s = LoadProblemSignature(Fixture("noisy_constant.py"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->outputs[0].shape, (std::vector<int64_t>{10, 3}));
}

SubprocessResult RunCli(std::vector<std::string> args);

// ---- Signatures without computing -----------------------------------------------------

// Runs `bridge.py signature FILE` directly: how the shapes were found
// ("meta", or "forward on cpu") is in its answer, not in the C++ Signature.
nlohmann::json BridgeSignature(const std::string& file) {
  auto py = ResolvePython();
  KS_CHECK(py.ok());
  SubprocessOptions o;
  o.argv = {py->python, ks::testing::SourcePath("evaluator/reference/bridge.py"), "signature", file};
  o.timeout_s = 300;
  auto r = RunSubprocess(o);
  KS_CHECK(r.ok());
  return nlohmann::json::parse(r->out, nullptr, false);
}

// The forward of huge_shapes.py needs 64 GiB (its input alone is 32 GiB); this
// machine class has far less, so a signature that ran it would fail or be
// killed. It must come back quickly, from shapes only.
TEST(MetaSignatureTest, ProblemLargerThanMemoryGetsItsSignatureWithoutRunning) {
  KS_REQUIRE_TORCH();
  auto t0 = std::chrono::steady_clock::now();
  auto s = LoadProblemSignature(Fixture("huge_shapes.py"));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(s.ok()) << s.status().message();
  // 5 s on an idle 2-core machine (one torch import); the bound leaves room for a loaded CI machine.
  EXPECT_LT(secs, 30.0);
  ASSERT_EQ(s->inputs.size(), 2u);
  EXPECT_EQ(s->inputs[0].shape, (std::vector<int64_t>{8192, 1 << 20}));
  EXPECT_EQ(s->inputs[0].bytes(), int64_t{32} << 30);
  EXPECT_EQ(s->inputs[1].dtype, DType::kBool);
  ASSERT_EQ(s->parameters.size(), 2u);
  EXPECT_EQ(s->Find("proj.weight")->shape, (std::vector<int64_t>{16, 512}));
  ASSERT_EQ(s->outputs.size(), 3u);
  EXPECT_EQ(s->outputs[0].shape, (std::vector<int64_t>{8192, 1 << 20}));
  EXPECT_EQ(s->outputs[1].dtype, DType::kInt64);  // argmax
  EXPECT_EQ(s->outputs[1].shape, (std::vector<int64_t>{8192}));
  EXPECT_TRUE(s->outputs[2].shape.empty());  // a 0-dim sum
  EXPECT_EQ(BridgeSignature(Fixture("huge_shapes.py")).value("inferred_by", ""), "meta");
}

// torch 1.13 has no meta kernel for max_pool3d; the bridge's shape rule must
// agree with PyTorch's (dilation, padding, ceil_mode), and `.cuda()` in forward
// must not force a real run on a machine without a GPU.
TEST(MetaSignatureTest, MaxPool3dOverA32GiBInputUsesTheShapeRule) {
  KS_REQUIRE_TORCH();
  auto j = BridgeSignature(Fixture("huge_pool3d.py"));
  ASSERT_TRUE(j.is_object() && !j.contains("error")) << j.dump();
  EXPECT_EQ(j.value("inferred_by", ""), "meta");
  auto s = SignatureFromJson(j);
  ASSERT_TRUE(s.ok()) << s.status().message();
  // (256 + 2*1 - 3*(3-1) - 1 + (2-1)) / 2 + 1 = 127, as nn.MaxPool3d computes it.
  EXPECT_EQ(s->outputs[0].shape, (std::vector<int64_t>{16, 32, 127, 127, 127}));
}

TEST(MetaSignatureTest, DataDependentShapesFallBackToARealForward) {
  KS_REQUIRE_TORCH();
  auto j = BridgeSignature(Fixture("data_dependent.py"));
  ASSERT_TRUE(j.is_object() && !j.contains("error")) << j.dump();
  EXPECT_EQ(j.value("inferred_by", ""), "forward on cpu");
  auto s = SignatureFromJson(j);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->outputs[0].shape, (std::vector<int64_t>{4, 3}));
}

// `problem info` (and `compile`, through the same LoadProblemSignature) is what
// a user runs on a CPU machine: it answers for the 32 GiB problem.
TEST(MetaSignatureTest, ProblemInfoAnswersForAHugeProblem) {
  KS_REQUIRE_TORCH();
  SubprocessResult info = RunCli({"problem", "info", Fixture("huge_shapes.py")});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_THAT(info.out, ::testing::ContainsRegex("input +x +float32 +\\[8192, 1048576\\]"));
}

// ---- Bad problem files ----------------------------------------------------------------

struct BadCase {
  std::string file;
  std::string expect;  // a piece of the message that names the cause
};

class BadProblemTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadProblemTest, ClearMessageNamingFileAndCause) {
  KS_REQUIRE_TORCH();
  const BadCase& c = GetParam();
  auto s = LoadProblemSignature(Fixture(c.file));
  ASSERT_FALSE(s.ok()) << c.file << " was accepted";
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << s.status().ToString();
  EXPECT_THAT(s.status().message(), HasSubstr(c.file));
  EXPECT_THAT(s.status().message(), HasSubstr(c.expect));
  // Without verbose the message is the cause, not a wall of traceback.
  EXPECT_THAT(s.status().message(), Not(HasSubstr("Traceback")));
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadProblemTest,
    ::testing::Values(BadCase{"bad_syntax.py", "bad_syntax.py: line 3"},
                      BadCase{"bad_no_model.py", "no 'Model' class"},
                      BadCase{"bad_get_inputs_raises.py", "get_inputs() raised RuntimeError: dataset not available"},
                      BadCase{"bad_forward_dict.py", "returned a dict"},
                      BadCase{"bad_forward_raises.py", "line 6: forward() raised RuntimeError"},
                      BadCase{"bad_complex.py", "dtype complex64"},
                      BadCase{"bad_import.py", "No module named 'kernelsearch_no_such_module'"},
                      BadCase{"no_such_problem.py", "no such file"},
                      BadCase{"bad_tolerance_key.py", "keys: atol, rtol, rel_norm, large_rel, large_share"},
                      BadCase{"bad_input_transforms.py", "INPUT_TRANSFORMS names unknown transform(s) 'scale'"}),
    [](const auto& info) {
      std::string n = info.param.file.substr(0, info.param.file.find('.'));
      for (char& ch : n)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(BadProblemVerboseTest, VerboseAddsTheTracebackTail) {
  KS_REQUIRE_TORCH();
  BridgeOptions o;
  o.verbose = true;
  auto s = LoadProblemSignature(Fixture("bad_get_inputs_raises.py"), o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("Traceback"));
  EXPECT_THAT(s.status().message(), HasSubstr("raise RuntimeError(\"dataset not available\")"));
}

// ---- Reference data --------------------------------------------------------------------

ReferenceOptions CpuOptions(const std::string& cache, int sets = 2, uint64_t seed = 42) {
  ReferenceOptions o;
  o.sets = sets;
  o.seed = seed;
  o.device = "cpu";
  o.cache_dir = cache;
  return o;
}

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

// ---- The bounded cache ------------------------------------------------------------------

// matmul.py: inputs 64x32 + 32x48 fp32, output 64x48 fp32, no parameters.
constexpr uint64_t kMatmulSetBytes = (64 * 32 + 32 * 48 + 64 * 48) * 4;

TEST(CacheTest, TheCapEvictsTheLeastRecentlyUsedEntry) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  // Room for two entries of two judging and four distribution-shifted sets
  // (plus manifests), not three.
  auto opts = [&](uint64_t seed) {
    ReferenceOptions o = CpuOptions(cache.string(), 2, seed);
    o.cache_cap = 13 * kMatmulSetBytes;
    return o;
  };
  auto a = PrepareReference(Fixture("matmul.py"), opts(1));
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = PrepareReference(Fixture("matmul.py"), opts(2));
  ASSERT_TRUE(b.ok()) << b.status().message();
  auto a_again = PrepareReference(Fixture("matmul.py"), opts(1));  // a is now the most recently used
  ASSERT_TRUE(a_again.ok()) << a_again.status().message();
  EXPECT_TRUE(a_again->from_cache);
  auto c = PrepareReference(Fixture("matmul.py"), opts(3));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->evicted, std::vector<std::string>{fs::path(b->dir).filename().string()});
  EXPECT_TRUE(fs::exists(a->dir));
  EXPECT_FALSE(fs::exists(b->dir));
  auto usage = ReadCacheUsage(cache.string());
  ASSERT_TRUE(usage.ok()) << usage.status().message();
  EXPECT_EQ(usage->entries.size(), 2u);
  EXPECT_LE(usage->entry_bytes, 13 * kMatmulSetBytes);
  EXPECT_EQ(usage->entries.back().path, c->dir);  // most recently used last
}

TEST(CacheTest, SetsBeyondTheCapAreNotPreparedAndTheWarningSaysWhy) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string(), 3);
  o.cache_cap = 2 * kMatmulSetBytes + kMatmulSetBytes / 2;
  auto r = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->sets.size(), 2u);
  EXPECT_EQ(r->sets_requested, 3);
  ASSERT_FALSE(r->warnings.empty());
  EXPECT_THAT(r->warnings[0], HasSubstr("using 2 of the 3 input sets"));
  EXPECT_THAT(r->warnings[0], HasSubstr("cap"));

  // Fewer than two sets cannot tell a kernel that ignores its inputs: refused, saying by how much.
  o.cache_cap = kMatmulSetBytes + kMatmulSetBytes / 2;
  o.sets = 2;
  auto small = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), Code::kResourceExhausted);
  EXPECT_THAT(small.status().message(), HasSubstr("matmul.py"));
  EXPECT_THAT(small.status().message(), HasSubstr("--cache-cap"));
}

TEST(CacheTest, SetsBeyondTheGpuBudgetAreNotPrepared) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string(), 4);
  // GpuEvaluator: the arena holds one set (inputs, outputs); per set, the
  // inputs' pristine copy and the reference outputs.
  const uint64_t in = (64 * 32 + 32 * 48) * 4, out = 64 * 48 * 4;
  o.device_budget = in + out + 3 * (in + out);
  auto r = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->sets.size(), 3u);
  ASSERT_FALSE(r->warnings.empty());
  EXPECT_THAT(r->warnings[0], HasSubstr("GPU memory"));
}

TEST(CacheTest, PracticeSetsFollowTheJudgingSetsAndAreKeptWhereRoomIsShort) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string(), 3);
  o.practice_sets = 1;
  o.practice_seed = 1042;
  auto r = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->JudgingSets(), 3);
  ASSERT_EQ(r->PracticeSets(), std::vector<int>{3});
  EXPECT_EQ(r->sets[3].seed, 1043u);
  EXPECT_TRUE(r->sets[3].transform.empty());
  ASSERT_GT(r->sets.size(), 4u);  // the shifted sets follow
  for (size_t s = 4; s < r->sets.size(); ++s) EXPECT_FALSE(r->sets[s].transform.empty()) << s;
  // Another entry than the reference without practice sets (its own key).
  auto plain = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string(), 3));
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_NE(plain->dir, r->dir);
  EXPECT_TRUE(plain->PracticeSets().empty());

  // Room for four sets: two judging sets, the practice set, one shifted set.
  TempDir small;
  ReferenceOptions tight = CpuOptions(small.path(), 3);
  tight.practice_sets = 1;
  tight.practice_seed = 1042;
  const uint64_t in = (64 * 32 + 32 * 48) * 4, out = 64 * 48 * 4;
  tight.device_budget = in + out + 4 * (in + out);
  auto t = PrepareReference(Fixture("matmul.py"), tight);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->JudgingSets(), 2);
  EXPECT_EQ(t->PracticeSets(), std::vector<int>{2});
  ASSERT_EQ(t->sets.size(), 4u);
  EXPECT_FALSE(t->sets[3].transform.empty());
}

TEST(CacheTest, TemporaryDirectoriesOfKilledRunsAreRemoved) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ASSERT_EQ(waitpid(dead, &status, 0), dead);
  const fs::path stale = fs::path(cache.string()) / (".tmp-matmul-" + std::to_string(dead) + "-0");
  const fs::path live = fs::path(cache.string()) / (".tmp-matmul-" + std::to_string(getpid()) + "-99");
  fs::create_directories(stale / "set0");
  fs::create_directories(live);
  ASSERT_TRUE(WriteFile((stale / "set0" / "x.bin").string(), std::string(4096, 'x')).ok());
  auto r = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));  // a run in progress (this process) is left alone
}

TEST(CacheTest, PhasesSayWhereThePreparationWentAndACacheHitSaysSo) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  auto first = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(first.ok()) << first.status().message();
  std::vector<std::string> names;
  for (const auto& [name, s] : first->phases) {
    names.push_back(name);
    EXPECT_GE(s, 0.0) << name;
  }
  for (const char* want : {"bridge: model build", "bridge: input generation", "bridge: forward",
                           "bridge: determinism check", "bridge: writing files"})
    EXPECT_THAT(names, ::testing::Contains(want));
  EXPECT_THAT(names[0], HasSubstr("signature"));
  auto hit = PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string()));
  ASSERT_TRUE(hit.ok()) << hit.status().message();
  ASSERT_EQ(hit->phases.size(), 1u);
  EXPECT_EQ(hit->phases[0].first, "cache lookup");
}

TEST(CacheTest, ByteSizesParse) {
  EXPECT_EQ(*ParseByteSize("20G"), uint64_t{20} << 30);
  EXPECT_EQ(*ParseByteSize("512M"), uint64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), uint64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("100 kb"), uint64_t{102400});
  EXPECT_EQ(*ParseByteSize("1000"), uint64_t{1000});
  for (const char* bad : {"", "G", "-1G", "12X", "1e30"}) EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
}

// ---- KernelBench constructs ---------------------------------------------------------------

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

// ---- The real binary ------------------------------------------------------------------------

SubprocessResult RunCli(std::vector<std::string> args) {
  SubprocessOptions o;
  o.argv = {KS_KERNELSEARCH_BIN};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.timeout_s = 300;
  auto r = RunSubprocess(o);
  KS_CHECK(r.ok());
  return *r;
}

TEST(CliTest, ProblemInfoPrintsTableAndJson) {
  KS_REQUIRE_TORCH();
  SubprocessResult table = RunCli({"problem", "info", Fixture("conv_params.py")});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("conv_params"));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("parameter +conv\\.weight +float32 +\\[8, 3, 3, 3\\]"));
  EXPECT_THAT(table.out, ::testing::ContainsRegex("output +out +float32 +\\[2, 8, 14, 14\\]"));

  SubprocessResult json_run = RunCli({"problem", "info", Fixture("matmul.py"), "--json"});
  ASSERT_EQ(json_run.exit_code, 0) << json_run.err;
  auto j = nlohmann::json::parse(json_run.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << json_run.out;
  auto sig = SignatureFromJson(j);
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_EQ(sig->outputs[0].shape, (std::vector<int64_t>{64, 48}));
}

TEST(CliTest, BadProblemExitsTwoWithTheCause) {
  KS_REQUIRE_TORCH();
  SubprocessResult r = RunCli({"problem", "info", Fixture("bad_syntax.py")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("bad_syntax.py: line 3"));
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// Issue 14: a user compiling a candidate that uses the device heap is told so, with malloc named.
TEST(CliTest, CompileRefusesDeviceHeapUseNamingMalloc) {
  KS_REQUIRE_TORCH();
  std::string cases = ks::testing::SourcePath("tests/adversarial/cases/");
  std::string scale = ks::testing::SourcePath("tests/evaluator/gpu_fixtures/scale.py");
  SubprocessResult r = RunCli({"compile", scale, cases + "27_heap_cache.md"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("status: compile_error"));
  EXPECT_THAT(r.out, HasSubstr("device-side heap allocation is not allowed (the kernel calls malloc"));
  SubprocessResult ok = RunCli({"compile", scale, cases + "control_scale.md"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err << ok.out;
}

TEST(CliTest, ProblemCheckExitsOneOnDegenerateOutputs) {
  KS_REQUIRE_TORCH();
  SubprocessResult bad = RunCli({"problem", "check", Fixture("all_zeros.py"), "--device", "cpu"});
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_THAT(bad.out, HasSubstr("all zeros"));
  SubprocessResult good = RunCli({"problem", "check", Fixture("matmul.py"), "--device", "cpu"});
  EXPECT_EQ(good.exit_code, 0) << good.err << good.out;
  SubprocessResult noted = RunCli({"problem", "check", Fixture("mostly_small.py"), "--device", "cpu"});
  EXPECT_EQ(noted.exit_code, 0) << noted.err << noted.out;
  EXPECT_THAT(noted.out, HasSubstr("note: output 'out': 9"));
}

// Issue 22: the check runs where the reference is computed (the GPU side; the
// fake evaluator stands for it here and runs the real bridge on the CPU), after
// the search is created: it is recorded failed with the reason, never silently
// judged by a reference that cannot tell right from wrong.
TEST(CliTest, ASearchOnADegenerateProblemNeedsAllowDegenerate) {
  KS_REQUIRE_TORCH();
  std::string db = ::testing::TempDir() + "/ks_degenerate_" + std::to_string(getpid()) + ".db";
  std::string fake = ::testing::TempDir() + "/ks_degenerate_fake_" + std::to_string(getpid()) + ".json";
  ASSERT_TRUE(WriteFile(fake, "{\"check_reference\": true}").ok());
  SubprocessResult refused = RunCli({"search", Fixture("all_zeros.py"), "--model", "command:cat", "--db", db,
                                     "--evaluator", "fake:" + fake});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("search 1"));
  EXPECT_THAT(refused.err, HasSubstr("all_zeros.py has a degenerate reference"));
  EXPECT_THAT(refused.err, HasSubstr("all zeros"));
  EXPECT_THAT(refused.err, HasSubstr("--allow-degenerate"));
  SubprocessResult history = RunCli({"history", "--db", db});
  EXPECT_THAT(history.out, HasSubstr("failed")) << history.out;
  // Resuming does not run it anyway: the problem must change first.
  SubprocessResult resumed = RunCli({"search", "--resume", "1", "--db", db, "--evaluator", "fake:" + fake});
  EXPECT_EQ(resumed.exit_code, 3) << resumed.err;
  EXPECT_THAT(resumed.err, HasSubstr("stopped on its GPU side"));
  // With the flag it goes past the check.
  SubprocessResult allowed = RunCli({"search", Fixture("all_zeros.py"), "--model", "command:cat", "--db", db,
                                     "--allow-degenerate", "--rounds", "0", "--branches", "1", "--quiet",
                                     "--evaluator", "fake:" + fake});
  EXPECT_THAT(allowed.err, ::testing::Not(HasSubstr("degenerate reference"))) << allowed.err;
  // Without a GPU, a real evaluator is refused before anything is written.
  if (!GpuAvailable()) {
    SubprocessResult gpu = RunCli({"search", Fixture("all_zeros.py"), "--model", "command:cat", "--db", db});
    EXPECT_EQ(gpu.exit_code, 3) << gpu.err;
    EXPECT_THAT(gpu.err, HasSubstr("needs a GPU"));
    EXPECT_THAT(gpu.err, HasSubstr("--generate-only"));
  }
  std::filesystem::remove(db);
  std::filesystem::remove(fake);
}

TEST(CliTest, SearchUsesThePythonItIsGiven) {
  // An interpreter without torch: the search must fail on it, naming it,
  // rather than quietly finding another python.
  std::string db = ::testing::TempDir() + "/ks_python_flag_" + std::to_string(getpid()) + ".db";
  SubprocessResult r = RunCli({"search", Fixture("matmul.py"), "--model", "command:cat", "--db", db, "--python",
                               "/bin/false", "--quiet", "--generate-only"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("/bin/false"));
  EXPECT_THAT(r.err, HasSubstr("torch"));
  std::filesystem::remove(db);
}

TEST(CliTest, CacheListShowsEntriesAndClearEmptiesIt) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ASSERT_TRUE(PrepareReference(Fixture("matmul.py"), CpuOptions(cache.string())).ok());
  SubprocessResult list = RunCli({"cache", "list", "--cache-dir", cache.string(), "--cache-cap", "1G", "--json"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  auto j = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << list.out;
  EXPECT_EQ(j["cap_bytes"], uint64_t{1} << 30);
  ASSERT_EQ(j["entries"].size(), 1u);
  EXPECT_EQ(j["entries"][0]["sets"], 2);
  EXPECT_EQ(j["entries"][0]["shifted_sets"], 4);  // one per transform of transforms.py
  EXPECT_GE(j["bytes"].get<uint64_t>(), 6 * kMatmulSetBytes);
  SubprocessResult table = RunCli({"cache", "list", "--cache-dir", cache.string()});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("matmul-"));
  EXPECT_THAT(table.out, HasSubstr("1 entry"));

  SubprocessResult clear = RunCli({"cache", "clear", "--cache-dir", cache.string()});
  ASSERT_EQ(clear.exit_code, 0) << clear.err;
  EXPECT_THAT(clear.out, HasSubstr("removed 1 entry"));
  auto after = ReadCacheUsage(cache.string());
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->entries.empty());

  SubprocessResult bad = RunCli({"cache", "list", "--cache-cap", "lots"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--cache-cap"));
}

// ---- The precision the baselines are timed under (issue 36) ----------------------------

bridge_internal::KeyFacts GpuKeyFacts() {
  bridge_internal::KeyFacts k;
  k.problem_bytes = "class Model: ...";
  k.bridge_bytes = "bridge.py";
  k.timing_bytes = "timing.py";
  k.transforms_bytes = "transforms.py";
  k.py.torch_version = "2.5.1";
  k.on_cuda = true;
  k.device_kind = "cuda:NVIDIA H100 80GB HBM3";
  return k;
}

std::string KeyUnder(const bridge_internal::KeyFacts& k, const std::string& precision, bool timed = true,
                     const std::string& kind = "") {
  ReferenceOptions o;
  o.precision = precision;
  return bridge_internal::KeyHash(k, o, timed, kind);
}

TEST(ReferenceKeyTest, HighestAndKernelBenchKeepTheKeysOfExistingEntries) {
  const bridge_internal::KeyFacts k = GpuKeyFacts();
  // The key as it was before contracts timed their own baselines (length-prefixed fields).
  auto field = [](const std::string& name, const std::string& value) {
    return name + ":" + std::to_string(value.size()) + ":" + value + "\n";
  };
  const std::string before = "kernelsearch-reference-v1\n" + field("problem", k.problem_bytes) + field("sets", "3") +
                             field("seed", "42") + field("device", k.device_kind) + field("bridge", k.bridge_bytes) +
                             field("timing", k.timing_bytes) + field("transforms", k.transforms_bytes) +
                             field("torch", k.py.torch_version) + field("timed", "1");
  EXPECT_EQ(KeyUnder(k, "highest"), Sha256Hex(before).substr(0, 32));
  for (const char* same : {"kernelbench", "fp32"}) EXPECT_EQ(KeyUnder(k, same), KeyUnder(k, "highest")) << same;
}

TEST(ReferenceKeyTest, HighAndMediumTimedOnAGpuAreEntriesOfTheirOwn) {
  bridge_internal::KeyFacts k = GpuKeyFacts();
  EXPECT_NE(KeyUnder(k, "high"), KeyUnder(k, "highest"));
  EXPECT_NE(KeyUnder(k, "medium"), KeyUnder(k, "highest"));
  EXPECT_NE(KeyUnder(k, "medium"), KeyUnder(k, "high"));
  EXPECT_EQ(KeyUnder(k, "tf32"), KeyUnder(k, "high"));  // the alias is the contract
  // A resident reference's cached timings too.
  EXPECT_NE(KeyUnder(k, "high", true, "resident timing"), KeyUnder(k, "highest", true, "resident timing"));
  // Untimed, or on the CPU (never timed), the entry is the same: truth and bounds do not depend on it.
  EXPECT_EQ(KeyUnder(k, "high", false), KeyUnder(k, "highest", false));
  k.on_cuda = false;
  k.device_kind = "cpu";
  EXPECT_EQ(KeyUnder(k, "medium"), KeyUnder(k, "highest"));
}

TEST(ReferenceKeyTest, TheBridgeIsToldTheLevelWhenItTimesOnAGpu) {
  auto level = [](const std::string& precision, bool time, bool on_cuda, bool may_stay) {
    ReferenceOptions o;
    o.precision = precision;
    o.time = time;
    const std::vector<std::string> args =
        bridge_internal::ReferenceArgs("p.py", o, on_cuda, uint64_t{1} << 30, may_stay, /*timing_cached=*/false);
    auto it = std::find(args.begin(), args.end(), "--precision");
    return it == args.end() ? std::string("absent") : it + 1 == args.end() ? std::string("no value") : *(it + 1);
  };
  for (bool may_stay : {false, true}) {
    EXPECT_EQ(level("high", true, true, may_stay), "high");
    EXPECT_EQ(level("tf32", true, true, may_stay), "high");
    EXPECT_EQ(level("medium", true, true, may_stay), "medium");
    for (const char* defaults : {"highest", "kernelbench", "fp32"})
      EXPECT_EQ(level(defaults, true, true, may_stay), "absent") << defaults;
    EXPECT_EQ(level("high", false, true, may_stay), "absent");  // not timed
  }
  EXPECT_EQ(level("high", true, false, false), "absent");  // the CPU: never timed
}

TEST(ReferenceKeyTest, TheManifestSaysWhatTheBaselinesWereTimedUnder) {
  KS_REQUIRE_TORCH();
  TempDir cache;
  ReferenceOptions o = CpuOptions(cache.string());
  o.precision = "high";
  auto d = PrepareReference(Fixture("matmul.py"), o);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->timing_precision, "default");  // the CPU: not timed
  auto text = ReadFile(d->dir + "/manifest.json");
  ASSERT_TRUE(text.ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  j["timing_precision"] = "high";
  auto high = bridge_internal::ReferenceFromManifest(j, "manifest");
  ASSERT_TRUE(high.ok()) << high.status().message();
  EXPECT_EQ(high->timing_precision, "high");
  j.erase("timing_precision");  // a manifest from before
  auto old = bridge_internal::ReferenceFromManifest(j, "manifest");
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(old->timing_precision, "");
}

}  // namespace
}  // namespace ks
