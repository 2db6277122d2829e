// Hardware counters (evaluator/profile/counters.h): the ncu command line, parsing its
// CSV (raw page, wide; details page, long), the digest a prompt shows and its
// size budget, failure reasons, and the JSON form. No GPU: the tables here are
// written in ncu's format by hand; the GPU tests read real ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Two launches of a plan as ncu --page raw --csv --print-units base writes
// them: its own messages first, then metric names, units, one row per kernel.
const char* kRawTable =
    "==PROF== Connected to process 4242 (/opt/ks/bin/ks-worker)\n"
    "==PROF== Profiling \"copy\" - 0: 0%....50%....100% - 38 passes\n"
    "\"ID\",\"Process ID\",\"Process Name\",\"Host Name\",\"Kernel Name\",\"Context\",\"Stream\","
    "\"gpu__time_duration.sum\",\"dram__bytes.sum.per_second\","
    "\"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed\",\"lts__throughput.avg.pct_of_peak_sustained_elapsed\","
    "\"lts__t_bytes.sum.per_second\",\"sm__throughput.avg.pct_of_peak_sustained_elapsed\","
    "\"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active\","
    "\"sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active\","
    "\"sm__warps_active.avg.pct_of_peak_sustained_active\",\"sm__maximum_warps_per_active_cycle_pct\","
    "\"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio\","
    "\"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio\","
    "\"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio\","
    "\"smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio\","
    "\"l1tex__t_sector_hit_rate.pct\",\"lts__t_sector_hit_rate.pct\","
    "\"l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum\",\"l1tex__data_pipe_lsu_wavefronts_mem_shared.sum\","
    "\"l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum\"\n"
    "\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"nsecond\",\"byte/second\",\"%\",\"%\",\"Gbyte/second\",\"%\",\"%\",\"%\",\"%\",\"%\","
    "\"\",\"\",\"\",\"\",\"%\",\"%\",\"\",\"\",\"sector\"\n"
    "\"0\",\"4242\",\"ks-worker\",\"127.0.0.1\",\"copy\",\"1\",\"7\",\"1,250,000\",\"2,750,000,000,000\",\"84.4\","
    "\"40.1\",\"3,100.5\",\"12.3\",\"0\",\"0\",\"88.2\",\"100\",\"6.0\",\"1.0\",\"1.0\",\"3.0\",\"0\",\"1.5\",\"0\","
    "\"1,024\",\"0\"\n"
    "\"1\",\"4242\",\"ks-worker\",\"127.0.0.1\",\"gemm(float const*, float*, int)\",\"1\",\"7\",\"2,000\",\"n/a\","
    "\"5.2\",\"30\",\"500\",\"71.5\",\"63.4\",\"60.2\",\"24.8\",\"25\",\"0.5\",\"2.5\",\"1\",\"0\",\"90.5\",\"70\","
    "\"65,536\",\"131,072\",\"16\"\n";

TEST(CountersTest, ParsesTheRawPage) {
  auto parsed = ParseNcuCsv(kRawTable, {"copy", "gemm"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_EQ(parsed->size(), 2u);
  const LaunchCounters& copy = (*parsed)[0];
  EXPECT_EQ(copy.index, 0);
  EXPECT_EQ(copy.kernel, "copy");
  EXPECT_DOUBLE_EQ(copy.duration_ms, 1.25);     // 1,250,000 ns
  EXPECT_DOUBLE_EQ(copy.dram_gbps, 2750);       // byte/second
  EXPECT_DOUBLE_EQ(copy.dram_pct, 84.4);
  EXPECT_DOUBLE_EQ(copy.l2_gbps, 3100.5);       // Gbyte/second
  EXPECT_DOUBLE_EQ(copy.tensor_pct, 0);
  EXPECT_DOUBLE_EQ(copy.achieved_occupancy_pct, 88.2);
  EXPECT_DOUBLE_EQ(copy.theoretical_occupancy_pct, 100);
  // long scoreboard 6, barrier 1, lg throttle 3 ("selected" is issuing, not a stall).
  ASSERT_EQ(copy.stalls.size(), 3u);
  EXPECT_EQ(copy.stalls[0].reason, "long_scoreboard");
  EXPECT_DOUBLE_EQ(copy.stalls[0].share, 0.6);
  EXPECT_EQ(copy.stalls[1].reason, "lg_throttle");
  EXPECT_DOUBLE_EQ(copy.shared_bank_conflicts, 0);
  const LaunchCounters& gemm = (*parsed)[1];
  EXPECT_EQ(gemm.kernel, "gemm");  // the plan's name, not ncu's demangled one
  EXPECT_LT(gemm.dram_gbps, 0);    // n/a: unknown, never 0
  EXPECT_DOUBLE_EQ(gemm.tensor_pct, 63.4);  // the busier of the two tensor figures
  EXPECT_DOUBLE_EQ(gemm.shared_bank_conflicts, 65536);
  EXPECT_DOUBLE_EQ(gemm.shared_wavefronts, 131072);
  EXPECT_DOUBLE_EQ(gemm.local_bytes, 16 * 32);
  EXPECT_DOUBLE_EQ(gemm.l1_hit_pct, 90.5);
}

TEST(CountersTest, ParsesTheDetailsPage) {
  std::string table =
      "\"ID\",\"Process ID\",\"Process Name\",\"Host Name\",\"Kernel Name\",\"Section Name\",\"Metric Name\","
      "\"Metric Unit\",\"Metric Value\"\n"
      "\"0\",\"1\",\"w\",\"h\",\"k\",\"GPU Speed Of Light Throughput\",\"gpu__time_duration.sum\",\"usecond\",\"12.5\"\n"
      "\"0\",\"1\",\"w\",\"h\",\"k\",\"GPU Speed Of Light Throughput\","
      "\"dram__throughput.avg.pct_of_peak_sustained_elapsed\",\"%\",\"91\"\n";
  auto parsed = ParseNcuCsv(table, {"k"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_EQ(parsed->size(), 1u);
  EXPECT_DOUBLE_EQ((*parsed)[0].duration_ms, 0.0125);
  EXPECT_DOUBLE_EQ((*parsed)[0].dram_pct, 91);
}

TEST(CountersTest, NoTableIsAnErrorSayingWhy) {
  auto perm = ParseNcuCsv(
      "==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
      "NVIDIA GPU Performance Counters on the target device 0.\n",
      {"k"});
  ASSERT_FALSE(perm.ok());
  EXPECT_THAT(perm.status().message(), HasSubstr("ERR_NVGPUCTRPERM"));
  auto none = ParseNcuCsv("==PROF== Disconnected from process 1\n==WARNING== No kernels were profiled.\n", {"k"});
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("no kernel"));
  EXPECT_EQ(NcuFailureReason("all fine"), "");
}

TEST(CountersTest, CommandNamesThePlanKernelsOnly) {
  auto argv = NcuCommand("/usr/local/cuda/bin/ncu", "/tmp/t.csv", {"b", "a", "b"}, 3, {"/bin/ks-worker", "serve"});
  std::string line;
  for (const auto& a : argv) line += a + " ";
  EXPECT_THAT(line, HasSubstr("--kernel-name regex:^(a|b)$"));
  EXPECT_THAT(line, HasSubstr("--launch-count 3"));
  EXPECT_THAT(line, HasSubstr("--log-file /tmp/t.csv"));
  EXPECT_THAT(line, HasSubstr("--clock-control none"));
  EXPECT_THAT(line, HasSubstr("--section WarpStateStats"));
  EXPECT_EQ(argv.front(), "/usr/local/cuda/bin/ncu");
  EXPECT_EQ(argv[argv.size() - 2], "/bin/ks-worker");
  EXPECT_EQ(argv.back(), "serve");
}

TEST(CountersTest, DigestIsShortAndNamesWhatMatters) {
  auto parsed = ParseNcuCsv(kRawTable, {"copy", "gemm"});
  ASSERT_TRUE(parsed.ok());
  std::string d = CountersDigest((*parsed)[0]);
  EXPECT_THAT(d, HasSubstr("DRAM 84% of peak (2750 GB/s)"));
  EXPECT_THAT(d, HasSubstr("stalls: long scoreboard 60%, lg throttle 30%, barrier 10%"));
  EXPECT_THAT(d, HasSubstr("tensor pipe 0%"));
  EXPECT_THAT(d, HasSubstr("occupancy 88% achieved of 100% theoretical"));
  EXPECT_LT(d.size(), 400u);
  std::string g = CountersDigest((*parsed)[1]);
  EXPECT_THAT(g, HasSubstr("tensor pipe 63%"));
  EXPECT_THAT(g, HasSubstr("bank conflicts 65536"));
  EXPECT_THAT(g, HasSubstr("local-memory (spill) traffic"));
  EXPECT_THAT(g, Not(HasSubstr("of peak (")));  // DRAM bandwidth unknown: no figure made up
}

TEST(CountersTest, TextKeepsToItsBudget) {
  CounterReport r;
  auto parsed = ParseNcuCsv(kRawTable, {"copy", "gemm"});
  ASSERT_TRUE(parsed.ok());
  for (int i = 0; i < 20; ++i) {
    LaunchCounters c = (*parsed)[i % 2];
    c.index = i;
    r.launches.push_back(c);
  }
  std::string text = CountersText(r, "  - ", 1200);
  EXPECT_LE(text.size(), 1200u + 60);
  EXPECT_THAT(text, HasSubstr("more launches (not shown)"));
  CounterReport none{{}, "no Nsight Compute (ncu) on PATH", 0};
  EXPECT_THAT(CountersText(none, "- "), HasSubstr("no hardware counters: no Nsight Compute"));
}

TEST(CountersTest, JsonRoundTripWithTheEvaluation) {
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  CounterReport r;
  r.launches = *ParseNcuCsv(kRawTable, {"copy", "gemm"});
  r.seconds = 3.5;
  r.note = "ncu reported 2 of the plan's 3 launches";
  e.counters = r;
  auto back = EvaluationFromJson(EvaluationToJson(e));
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(back->counters.has_value());
  EXPECT_EQ(back->counters->note, r.note);
  EXPECT_DOUBLE_EQ(back->counters->seconds, 3.5);
  ASSERT_EQ(back->counters->launches.size(), 2u);
  EXPECT_EQ(CountersDigest(back->counters->launches[1]), CountersDigest(r.launches[1]));
  // Evaluations stored before counters existed have none.
  Evaluation plain;
  EXPECT_FALSE(EvaluationFromJson(EvaluationToJson(plain))->counters.has_value());
}

}  // namespace
}  // namespace ks
