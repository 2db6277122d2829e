// Tests of the reference bridge (evaluator/problem.h): where its data files and
// python are found, problem signatures (computed and shape-only) and bad
// problem files. They run the bridge with a real python3 + torch (CPU is
// enough); without one they skip, saying why.
#include "tests/evaluator/problem_test_util.h"

namespace ks {
namespace {

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

}  // namespace
}  // namespace ks
