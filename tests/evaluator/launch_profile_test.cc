// The per-launch figures: which resource limits a kernel's occupancy (checked
// against what the CUDA occupancy calculator gives for an H100's SM), the
// figures of each launch from its times and buffers, and their JSON form.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "evaluator/evaluation.h"
#include "evaluator/profile/launch_profile.h"

namespace ks {
namespace {

using ::testing::HasSubstr;

// cuDeviceGetAttribute on an H100 SXM.
constexpr SmLimits kH100{65536, 65536, 233472, 1024, 2048, 32};

Occupancy Explain(int threads, int registers, int64_t shared, int api_blocks) {
  Occupancy o;
  o.threads_per_block = threads;
  o.registers = registers;
  o.shared_bytes = shared;
  o.blocks_per_sm = api_blocks;
  ExplainOccupancy(kH100, &o);
  return o;
}

TEST(LaunchProfileTest, RegistersLimit) {
  // 64 registers x 256 threads = 16384 per block: 4 blocks fill the register file.
  Occupancy o = Explain(256, 64, 0, 4);
  EXPECT_EQ(o.by_registers, 4);
  EXPECT_EQ(o.by_threads, 8);
  EXPECT_EQ(o.by_block_limit, 32);
  EXPECT_EQ(o.limiter, "registers");
  EXPECT_DOUBLE_EQ(o.warps_fraction, 0.5);
}

TEST(LaunchProfileTest, RegistersRoundUpPerWarp) {
  // 33 registers round up to 40 per thread (256 per warp): 65536 / (40*32*8 warps) = 6 blocks.
  Occupancy o = Explain(256, 33, 0, 6);
  EXPECT_EQ(o.by_registers, 6);
  EXPECT_EQ(o.limiter, "registers");
}

TEST(LaunchProfileTest, SharedMemoryLimit) {
  // 100 KiB + the 1 KiB the driver reserves per block: two fit in 228 KiB.
  Occupancy o = Explain(128, 32, 100 * 1024, 2);
  EXPECT_EQ(o.by_shared, 2);
  EXPECT_EQ(o.limiter, "shared memory");
}

TEST(LaunchProfileTest, ThreadsLimitAtFullOccupancy) {
  // 32 registers x 1024 threads: both registers and threads allow 2 blocks; the
  // kernel is at full occupancy, which the thread count decides.
  Occupancy o = Explain(1024, 32, 0, 2);
  EXPECT_EQ(o.by_registers, 2);
  EXPECT_EQ(o.by_threads, 2);
  EXPECT_EQ(o.limiter, "threads");
  EXPECT_DOUBLE_EQ(o.warps_fraction, 1.0);
}

TEST(LaunchProfileTest, BlockLimit) {
  Occupancy o = Explain(32, 16, 0, 32);
  EXPECT_EQ(o.by_threads, 64);
  EXPECT_EQ(o.limiter, "block limit");
  EXPECT_DOUBLE_EQ(o.warps_fraction, 0.5);
}

TEST(LaunchProfileTest, UnknownLimitsNameNoLimiter) {
  Occupancy o;
  o.threads_per_block = 256;
  o.registers = 32;
  o.blocks_per_sm = 8;
  ExplainOccupancy(SmLimits{}, &o);
  EXPECT_EQ(o.limiter, "");
  EXPECT_EQ(o.by_registers, -1);
}

TEST(LaunchProfileTest, FiguresPerLaunch) {
  // Two launches, 0.3 and 0.1 ms; the first passed 300 MB, the second 100 MB.
  auto ps = BuildLaunchProfiles({"a", "b"}, {{0.31, 0.3, 0.29}, {0.1, 0.1, 0.5}}, {3e8, 1e8}, /*flops=*/1e9,
                                /*peak_gbps=*/2000, /*peak_tflops=*/50, {Explain(256, 64, 0, 4), std::nullopt});
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_DOUBLE_EQ(ps[0].median_ms, 0.3);
  EXPECT_DOUBLE_EQ(ps[1].median_ms, 0.1);
  EXPECT_EQ(ps[0].runs, 3);
  EXPECT_NEAR(ps[0].share, 0.75, 1e-12);
  EXPECT_NEAR(ps[0].achieved_gbps, 1000, 1e-6);
  EXPECT_NEAR(ps[0].floor_ms, 0.15, 1e-12);      // 300 MB at 2000 GB/s
  EXPECT_NEAR(ps[0].fraction_of_floor, 0.5, 1e-12);
  EXPECT_EQ(ps[0].flops, 0);                     // two launches: the plan's FLOPs are not theirs to split
  ASSERT_TRUE(ps[0].occupancy);
  EXPECT_FALSE(ps[1].occupancy);

  auto one = BuildLaunchProfiles({"mm"}, {{2.0}}, {1e6}, 1e12, 2000, 50, {std::nullopt});
  EXPECT_NEAR(one[0].achieved_tflops, 500, 1e-9);   // 1 TFLOP in 2 ms
  EXPECT_NEAR(one[0].floor_ms, 20.0, 1e-9);      // 1 TFLOP at 50 TFLOP/s: compute-bound

  std::string text = LaunchProfileText(ps, "- ");
  EXPECT_THAT(text, HasSubstr("- launch 0 `a`: 0.3000 ms (75% of the plan), 1000 GB/s over the 286.1 MiB of buffers"));
  EXPECT_THAT(text, HasSubstr("occupancy 4 blocks/SM of 256 threads (50% of the SM's warps), 64 registers/thread"));
  EXPECT_THAT(text, HasSubstr("limited by registers (registers allow 4, shared memory 228, threads 8, block limit 32)"));
  EXPECT_THAT(text, HasSubstr("- launch 1 `b`: 0.1000 ms (25% of the plan)"));
}

TEST(LaunchProfileTest, ClusterResidencyIsShown) {
  Occupancy o = Explain(1024, 32, 0, 2);
  o.cluster_size = 2;
  o.max_active_clusters = 132;
  auto ps = BuildLaunchProfiles({"rows"}, {{0.5}}, {0}, 0, 0, 0, {o});
  EXPECT_THAT(LaunchProfileText(ps, ""), HasSubstr("; clusters of 2 blocks: at most 132 resident on the GPU"));
  ps[0].occupancy->max_active_clusters = -1;
  EXPECT_THAT(LaunchProfileText(ps, ""), HasSubstr("; clusters of 2 blocks: residency unknown"));
  auto back = LaunchProfilesFromJson(LaunchProfilesToJson(ps));
  EXPECT_EQ(back[0].occupancy->cluster_size, 2);
  EXPECT_EQ(back[0].occupancy->max_active_clusters, -1);
}

TEST(LaunchProfileTest, StoredWithTheEvaluation) {
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.launch_profiles = BuildLaunchProfiles({"a", "b"}, {{0.3}, {0.1}}, {3e8, 1e8}, 0, 2000, 0,
                                          {Explain(256, 64, 0, 4), std::nullopt});
  auto back = EvaluationFromJson(EvaluationToJson(e));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->launch_profiles.size(), 2u);
  EXPECT_EQ(LaunchProfilesToJson(back->launch_profiles), LaunchProfilesToJson(e.launch_profiles));
  EXPECT_EQ(back->launch_profiles[0].occupancy->limiter, "registers");
  // An evaluation stored before these figures existed reads with none.
  nlohmann::json old = EvaluationToJson(e);
  old.erase("launch_profiles");
  auto older = EvaluationFromJson(old);
  ASSERT_TRUE(older.ok());
  EXPECT_TRUE(older->launch_profiles.empty());
}

}  // namespace
}  // namespace ks
