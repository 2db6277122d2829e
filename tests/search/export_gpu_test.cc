// `kernelsearch export` on a GPU: the exported module runs in PyTorch as a
// drop-in for the problem's Model and matches it (torch.allclose), at the
// problem's shapes and at another batch size. The store is filled through its
// API with a known-correct kernel and a correct evaluation; the real binary
// exports it; python3 + torch (resolved as the evaluator resolves it) runs it.
// Skips without a GPU.
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "common/files.h"
#include "tests/test_paths.h"
#include "common/subprocess.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/problem.h"
#include "search/search_config.h"
#include "store/lineage_store.h"
#include "tests/search/store_fill.h"
#include "tests/search/export_check.h"
#include "tests/search/export_kernels.h"

namespace ks {
namespace {



class ExportGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!GpuAvailable(&why)) GTEST_SKIP() << "no GPU here: " << why;
    dir_ = std::filesystem::temp_directory_path() /
           ("ks_export_gpu_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Stores the fixture problem (with its real signature, from the bridge), a
  // candidate and a correct evaluation; returns the candidate id.
  int64_t Fill(const std::string& fixture, const std::string& source, const std::string& plan) {
    const std::string file = ks::testing::SourceDir() + "/tests/evaluator/gpu_fixtures/" + fixture;
    auto sig = LoadProblemSignature(file);
    EXPECT_TRUE(sig.ok()) << sig.status().ToString();
    auto text = ReadFile(file);
    auto store = store::LineageStore::Open(Path("ks.db"));
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!sig.ok() || !text.ok() || !store.ok()) return 0;
    store::ProblemRow p;
    p.name = sig->name;
    p.file_path = file;
    p.source = *text;
    p.signature_json = SignatureToJson(*sig).dump();
    return testing::StoreCorrectSeed(store->get(), p, source, plan, "test GPU", 1.5);
  }

  // Exports candidate `id` with the real binary and runs tests/export/check_module.py on it.
  void ExportAndCompare(int64_t id, const std::string& shapes, double atol, double rtol) {
    ASSERT_GT(id, 0);
    const std::string out = Path("export_" + std::to_string(id));
    SubprocessOptions ex;
    ex.argv = {ks::testing::CliBinary(), "export", std::to_string(id), "--db", Path("ks.db"), "--out", out};
    ex.timeout_s = 180;
    auto exported = RunSubprocess(ex);
    ASSERT_TRUE(exported.ok()) << exported.status().ToString();
    ASSERT_TRUE(exported->Succeeded()) << exported->Describe() << "\n" << exported->err;

    auto python = ResolvePython();
    ASSERT_TRUE(python.ok()) << python.status().ToString();
    ASSERT_TRUE(python->cuda) << python->python << " has torch " << python->torch_version << " without CUDA";
    SubprocessOptions run;
    run.argv = {python->python, testing::ExportCheckScript(), out, shapes, std::to_string(atol), std::to_string(rtol)};
    run.timeout_s = 300;
    auto r = RunSubprocess(run);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::printf("%s", r->out.c_str());
    ASSERT_TRUE(r->Succeeded()) << r->Describe() << "\nstdout: " << r->out << "\nstderr: " << r->err;
    EXPECT_NE(r->out.find("EXPORT_MATCHES"), std::string::npos) << r->out << r->err;
  }

  std::filesystem::path dir_;
};

// Two launches, a scratch buffer, int32 + int64 + float parameters, a
// parameter tensor; at the problem's shape and at 1000 rows.
TEST_F(ExportGpuTest, LayerNormExportMatchesTheModel) {
  int64_t id = Fill("layernorm_small.py", testing::kLayerNormSource, testing::kLayerNormPlan);
  ExportAndCompare(id, "[[4096, 1024], [1000, 1024]]", 1e-4, 1e-4);
}

// Dynamic shared memory over 48 KiB and, on Hopper and later, thread-block
// clusters; at the problem's shape, at 1000 rows, and at 2000 columns (32 KB of
// shared memory).
TEST_F(ExportGpuTest, SoftmaxExportWithBigSharedMemoryAndClustersMatchesTheModel) {
  auto arch = DetectArch();
  ASSERT_TRUE(arch.ok()) << arch.status().ToString();
  const bool hopper = std::stoi(arch->substr(3)) >= 90;  // "sm_90", "sm_100": clusters need sm_90 and up
  int64_t id = Fill("softmax_small.py", testing::kSoftmaxSource,
                    hopper ? testing::kSoftmaxClusterPlan : testing::kSoftmaxPlan);
  ExportAndCompare(id, "[[2048, 4096], [1000, 4096], [2048, 2000]]", 1e-6, 1e-4);
}

// A plan with a TMA tensor map (issue 23): the module builds the map with
// cuTensorMapEncodeTiled from each call's own tensor and runs the sm_90a
// kernel; at the problem's shape and at another one (rows of 384 bytes).
TEST_F(ExportGpuTest, TmaTensorMapExportMatchesTheModel) {
  auto arch = DetectArch();
  ASSERT_TRUE(arch.ok()) << arch.status().ToString();
  if (std::stoi(arch->substr(3)) < 90) GTEST_SKIP() << "TMA needs compute capability 9.0";
  const std::string dir = std::string(KS_SOURCE_DIR) + "/tests/evaluator/gpu_fixtures/";
  auto source = ReadFile(dir + "tma_tile_copy.cu");
  auto plan = ReadFile(dir + "tma_tile_copy.json");
  ASSERT_TRUE(source.ok() && plan.ok());
  int64_t id = Fill("tma_copy.py", *source, *plan);
  ExportAndCompare(id, "[[300, 200], [64, 96]]", 0, 0);
}

}  // namespace
}  // namespace ks
