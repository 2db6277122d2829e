// Tests of the reference bridge through the real binary: `kernelsearch problem`,
// `compile`, `search` on degenerate problems and `cache`. They need a real
// python3 + torch (CPU is enough); without one they skip, saying why.
#include "tests/evaluator/problem_test_util.h"

namespace ks {
namespace {

// ---- The real binary ------------------------------------------------------------------------

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
  TempDir dir("ks_degenerate_");
  std::string db = (dir / "lineage.db").string();
  std::string fake = (dir / "fake.json").string();
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
  TempDir dir("ks_python_flag_");
  std::string db = (dir / "lineage.db").string();
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

}  // namespace
}  // namespace ks
