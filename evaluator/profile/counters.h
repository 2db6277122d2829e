// Hardware counters of a candidate's launches, read by Nsight Compute (ncu),
// for a model deciding what to change: why a kernel is as fast as it is
// (achieved DRAM and L2 bandwidth against peak, SM and tensor-pipe use,
// occupancy, where warps stall, hit rates, bank conflicts).
//
// How they are read (GpuEvaluator::ReadCounters): one more run of the
// candidate, in a second sandboxed worker started under ncu, prepared and
// verified like every other run. The candidate's status comes from its
// ordinary runs only; a profiled run that is not correct drops the counters
// and says so (a kernel that behaves differently under the profiler gains
// nothing: its ordinary runs judge it). Where ncu is missing or may not read
// the counters, the note says why and the evaluation goes on without them.
//
// This file holds the pure part: the ncu command line, parsing its CSV, the
// digest a prompt shows, and the JSON form. Thread-safe (no state).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ks {

struct WarpStall {
  std::string reason;  // ncu's name: "long_scoreboard", "barrier", "math_pipe_throttle", ...
  double share = 0;    // of all stall cycles per issued instruction (0..1)
};

// One launch of the plan as ncu measured it. A figure ncu did not report is
// negative (-1): unknown, never 0.
struct LaunchCounters {
  int index = 0;              // the launch's place in the plan
  std::string kernel;
  double duration_ms = -1;
  double dram_gbps = -1;      // achieved DRAM bandwidth
  double dram_pct = -1;       // DRAM throughput, % of the peak sustained
  double l2_gbps = -1;
  double l2_pct = -1;
  double sm_pct = -1;         // SM throughput, % of peak
  double tensor_pct = -1;     // the busiest tensor pipe, % of peak while active
  double achieved_occupancy_pct = -1;
  double theoretical_occupancy_pct = -1;
  std::vector<WarpStall> stalls;  // the top reasons, largest first
  double l1_hit_pct = -1;
  double l2_hit_pct = -1;
  double shared_bank_conflicts = -1;  // shared-memory bank conflicts (loads + stores), count
  double shared_wavefronts = -1;      // shared-memory wavefronts (conflict-free = one per request)
  double local_bytes = -1;            // local-memory (spill) traffic, bytes
};

struct CounterReport {
  std::vector<LaunchCounters> launches;
  std::string note;      // why there are none, or what is missing ("" when all is well)
  double seconds = 0;    // wall time of the profiled run (profiling overhead)
};

// $KS_NCU ("none": no counters), else ncu on PATH, else under CUDA's bin
// folders ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda); "" when there is none.
std::string FindNcu();

// The sections whose metrics the digest reads (ncu --section ...).
const std::vector<std::string>& NcuSections();

// Metrics asked for by name beside the sections.
const std::vector<std::string>& NcuExtraMetrics();

// ncu's arguments for profiling `kernels` (the plan's kernel names) in the
// worker command `worker_argv`, writing the raw metrics as CSV to `log_file`.
// extra_metrics: also NcuExtraMetrics() by name (an ncu that knows none of
// them refuses the whole profile: the caller then asks again without).
std::vector<std::string> NcuCommand(const std::string& ncu, const std::string& log_file,
                                    const std::vector<std::string>& kernels, int launches,
                                    const std::vector<std::string>& worker_argv, bool extra_metrics = true);

// ncu refused a metric asked for by name (another chip or ncu version).
bool NcuRefusedAMetric(const std::string& log);

// The launches of ncu's raw CSV page (--page raw --csv --print-units base) in
// the order profiled. `plan_kernels` gives each its place in the plan (the
// n-th profiled kernel is launch n). Lines before the CSV header (ncu's own
// messages) are skipped; an ncu error found there is the error.
StatusOr<std::vector<LaunchCounters>> ParseNcuCsv(const std::string& text, const std::vector<std::string>& plan_kernels);

// Why ncu could not read counters, from its log ("" when it does not say):
// a permission error (ERR_NVGPUCTRPERM), an unsupported device, no kernels profiled.
std::string NcuFailureReason(const std::string& log);

// One short line per launch for prompts and `eval`:
// "DRAM 61% of peak (1830 GB/s), L2 hit 12%, SM 20%, tensor pipe 0%, occupancy 48% of 50%,
//  stalls: long scoreboard 48%, barrier 21%; bank conflicts 0".
std::string CountersDigest(const LaunchCounters& c);
// Every launch's digest, one per line after `bullet`, at most max_chars in all
// (lines beyond the budget are summarized as "... N more launches").
std::string CountersText(const CounterReport& r, const std::string& bullet, size_t max_chars = 1500);

nlohmann::json CounterReportToJson(const CounterReport& r);
CounterReport CounterReportFromJson(const nlohmann::json& j);

}  // namespace ks
