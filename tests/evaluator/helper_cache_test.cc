// The helper kernels' cubin cache (evaluator/compile/helper_cache.h): memory,
// disk, corrupt entries compiled again, a refused cubin compiled again; and
// the real helper source through NVRTC (no GPU needed: the "load" is faked).
#include "evaluator/compile/helper_cache.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/files.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/gpu_evaluator_internal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ks {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class HelperCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("ks-helper-cache-test-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    ClearHelperCubinMemory();
  }
  void TearDown() override {
    fs::remove_all(dir_);
    ClearHelperCubinMemory();
  }

  // A compiler that counts its calls and returns `cubin`.
  HelperCompileFn Counting(int* calls, std::string cubin = "\x7f" "ELF fake cubin") {
    return [calls, cubin]() -> StatusOr<std::string> {
      ++*calls;
      return cubin;
    };
  }
  static Status AcceptAll(const std::string&) { return Status::Ok(); }

  std::string dir_;
};

TEST_F(HelperCacheTest, KeyDependsOnSourceTargetAndCompiler) {
  const std::string k = HelperCacheKey("src", "sm_90a", "nvrtc 13");
  EXPECT_EQ(k, HelperCacheKey("src", "sm_90a", "nvrtc 13"));
  EXPECT_NE(k, HelperCacheKey("src2", "sm_90a", "nvrtc 13"));
  EXPECT_NE(k, HelperCacheKey("src", "sm_100a", "nvrtc 13"));
  EXPECT_NE(k, HelperCacheKey("src", "sm_90a", "nvrtc 12"));
  EXPECT_NE(HelperCacheKey("ab", "c", ""), HelperCacheKey("a", "bc", ""));  // no ambiguous joins
}

TEST_F(HelperCacheTest, CompilerIdNamesTheWorkerAndTheHeaders) {
  const std::string id = HelperCompilerId(KS_WORKER_PATH, "/usr/local/cuda");
  EXPECT_THAT(id, HasSubstr(KS_WORKER_PATH));
  EXPECT_THAT(id, HasSubstr("/usr/local/cuda"));
  EXPECT_THAT(id, HasSubstr("cuda "));
  EXPECT_NE(id, HelperCompilerId(KS_WORKER_PATH, "/opt/cuda"));
}

TEST_F(HelperCacheTest, SecondLoadComesFromMemoryThenFromDisk) {
  const std::string key = HelperCacheKey("src", "sm_90a", "id");
  int calls = 0;
  auto first = GetHelperCubin(key, dir_, Counting(&calls), AcceptAll);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->origin, HelperCubinOrigin::kCompiled);
  EXPECT_TRUE(fs::exists(HelperCacheFile(dir_, key)));
  auto second = GetHelperCubin(key, dir_, Counting(&calls), AcceptAll);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->origin, HelperCubinOrigin::kMemory);
  ClearHelperCubinMemory();  // a new command: only the disk remembers
  auto third = GetHelperCubin(key, dir_, Counting(&calls), AcceptAll);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->origin, HelperCubinOrigin::kDisk);
  EXPECT_EQ(third->cubin, first->cubin);
  EXPECT_EQ(calls, 1);
}

TEST_F(HelperCacheTest, NoDirectoryKeepsOnlyTheMemory) {
  const std::string key = HelperCacheKey("src", "sm_90a", "id");
  int calls = 0;
  ASSERT_TRUE(GetHelperCubin(key, "", Counting(&calls), AcceptAll).ok());
  ASSERT_TRUE(GetHelperCubin(key, "", Counting(&calls), AcceptAll).ok());
  EXPECT_EQ(calls, 1);
  ClearHelperCubinMemory();
  auto again = GetHelperCubin(key, "", Counting(&calls), AcceptAll);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->origin, HelperCubinOrigin::kCompiled);
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(fs::exists(dir_));
}

TEST_F(HelperCacheTest, CorruptOrTruncatedFilesAreCompiledAgainAndOverwritten) {
  const std::string key = HelperCacheKey("src", "sm_90a", "id");
  const std::string cubin = std::string("\x7f" "ELF") + std::string(1000, 'x');
  ASSERT_TRUE(WriteHelperCubin(dir_, key, cubin).ok());
  const std::string path = HelperCacheFile(dir_, key);
  auto whole = ReadFile(path);
  ASSERT_TRUE(whole.ok());
  ASSERT_TRUE(ReadHelperCubin(dir_, key).ok());

  std::string flipped = *whole;
  flipped[flipped.size() - 10] ^= 1;  // a bit of the cubin
  const std::vector<std::string> bad = {whole->substr(0, whole->size() - 1), flipped, *whole + "x", "", "garbage"};
  for (const std::string& content : bad) {
    ASSERT_TRUE(WriteFile(path, content).ok());
    EXPECT_FALSE(ReadHelperCubin(dir_, key).ok()) << content.size() << " bytes";
    ClearHelperCubinMemory();
    int calls = 0;
    auto got = GetHelperCubin(key, dir_, Counting(&calls, cubin), AcceptAll);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->origin, HelperCubinOrigin::kCompiled);
    EXPECT_EQ(calls, 1);
    auto rewritten = ReadHelperCubin(dir_, key);  // overwritten with a whole entry
    ASSERT_TRUE(rewritten.ok()) << rewritten.status().ToString();
    EXPECT_EQ(*rewritten, cubin);
  }
}

TEST_F(HelperCacheTest, AnotherKeysFileIsNotRead) {
  const std::string a = HelperCacheKey("a", "sm_90a", "id"), b = HelperCacheKey("b", "sm_90a", "id");
  ASSERT_TRUE(WriteHelperCubin(dir_, a, "cubin of a").ok());
  fs::copy_file(HelperCacheFile(dir_, a), HelperCacheFile(dir_, b), fs::copy_options::overwrite_existing);
  auto read = ReadHelperCubin(dir_, b);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr("not a helper cubin of this key"));
  EXPECT_EQ(ReadHelperCubin(dir_, "nothing-here").status().code(), Code::kNotFound);
}

TEST_F(HelperCacheTest, ACachedCubinTheDriverRefusesIsCompiledAgain) {
  const std::string key = HelperCacheKey("src", "sm_90a", "id");
  ASSERT_TRUE(WriteHelperCubin(dir_, key, "stale cubin").ok());
  int calls = 0;
  // Module::Load stands here: it refuses the stale one.
  auto accept = [](const std::string& cubin) {
    return cubin == "stale cubin" ? Internal("cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE") : Status::Ok();
  };
  auto got = GetHelperCubin(key, dir_, Counting(&calls, "fresh cubin"), accept);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->cubin, "fresh cubin");
  EXPECT_EQ(got->origin, HelperCubinOrigin::kCompiled);
  EXPECT_EQ(*ReadHelperCubin(dir_, key), "fresh cubin");
  // A compiled one refused too fails the call: nothing else to try.
  ClearHelperCubinMemory();
  auto refused = GetHelperCubin(key, dir_, Counting(&calls), [](const std::string&) { return Internal("no GPU"); });
  EXPECT_FALSE(refused.ok());
}

TEST_F(HelperCacheTest, CompileErrorsComeBackAndAreNotCached) {
  const std::string key = HelperCacheKey("src", "sm_90a", "id");
  auto failed = GetHelperCubin(key, dir_, []() -> StatusOr<std::string> { return Internal("nvrtc failed"); }, AcceptAll);
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("nvrtc failed"));
  EXPECT_FALSE(fs::exists(HelperCacheFile(dir_, key)));
}

TEST_F(HelperCacheTest, AnUnwritableDirectoryCostsOnlyTheCompile) {
  const std::string file = dir_ + "-file";
  ASSERT_TRUE(WriteFile(file, "not a directory").ok());
  int calls = 0;
  auto got = GetHelperCubin(HelperCacheKey("src", "sm_90a", "id"), file + "/sub", Counting(&calls), AcceptAll);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(calls, 1);
  fs::remove(file);
}

TEST_F(HelperCacheTest, EvaluatorsSettingUpTogetherCompileOnce) {
  const std::string key = HelperCacheKey("src", "sm_90a", "id");
  std::atomic<int> calls{0};
  auto slow = [&]() -> StatusOr<std::string> {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return std::string("cubin");
  };
  std::vector<std::thread> gpus;
  for (int i = 0; i < 4; ++i) gpus.emplace_back([&] { EXPECT_TRUE(GetHelperCubin(key, "", slow, AcceptAll).ok()); });
  for (auto& t : gpus) t.join();
  EXPECT_EQ(calls.load(), 1);
}

// The real helper source through NVRTC (ks-worker compile-server), as
// GpuEvaluator::LoadHelpers does, with the driver's load faked: the second
// command reads the disk, byte for byte what was compiled.
TEST_F(HelperCacheTest, RealHelperSourceIsCachedOnDisk) {
  CompileOptions co;
  co.worker_path = KS_WORKER_PATH;
  co.arch = "sm_90a";
  auto home = FindCudaHome("");
  if (!home.ok()) GTEST_SKIP() << home.status().ToString();
  const std::string key =
      HelperCacheKey(gpu_internal::kHelperSource, co.arch, HelperCompilerId(KS_WORKER_PATH, *home));
  int calls = 0;
  auto compile = [&]() -> StatusOr<std::string> {
    ++calls;
    KS_ASSIGN_OR_RETURN(CompileResult r, CompileCandidate(gpu_internal::kHelperSource, co));
    if (!r.ok) return Internal(r.message + "\n" + r.log);
    return r.cubin;
  };
  auto first = GetHelperCubin(key, dir_, compile, AcceptAll);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->origin, HelperCubinOrigin::kCompiled);
  EXPECT_EQ(first->cubin.compare(0, 4, "\x7f" "ELF"), 0);
  ClearHelperCubinMemory();
  auto second = GetHelperCubin(key, dir_, compile, AcceptAll);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->origin, HelperCubinOrigin::kDisk);
  EXPECT_EQ(second->cubin, first->cubin);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace ks
