// Per-launch figures of a correct candidate, for a model deciding what to
// change: the time of each launch of its plan on its own, what that launch
// achieves against the device's measured peaks, and the theoretical occupancy
// of its kernel with the resource that limits it. The times come from an extra
// run with events between the launches, outside the timed measurement (whose
// runs have no events inside the plan); the occupancy from the driver's
// occupancy API plus the kernel's attributes. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ks {

// What one SM offers (cuDeviceGetAttribute); 0 is unknown.
struct SmLimits {
  int registers_per_sm = 0;
  int max_registers_per_block = 0;
  int64_t shared_per_sm = 0;
  int64_t reserved_shared_per_block = 0;  // the driver's own use, per resident block
  int max_threads_per_sm = 0;
  int max_blocks_per_sm = 0;
};

// Theoretical occupancy of one launch's kernel.
struct Occupancy {
  int blocks_per_sm = 0;     // cuOccupancyMaxActiveBlocksPerMultiprocessor
  int threads_per_block = 0;
  int registers = 0;         // per thread (CU_FUNC_ATTRIBUTE_NUM_REGS)
  int64_t shared_bytes = 0;  // per block: static + dynamic
  // Each resource's own bound on resident blocks per SM (-1: not known).
  int by_registers = -1, by_shared = -1, by_threads = -1, by_block_limit = -1;
  std::string limiter;       // "registers", "shared memory", "threads", "block limit" ("" unknown)
  double warps_fraction = 0; // resident warps / the SM's maximum
  // Cluster launches: blocks per cluster, and how many clusters the whole GPU
  // holds at once (cuOccupancyMaxActiveClusters; -1 unknown).
  int cluster_size = 0;
  int max_active_clusters = -1;
};

struct LaunchProfile {
  int index = 0;
  std::string kernel;
  double median_ms = 0;       // this launch alone, median over the profile runs
  int runs = 0;
  double share = 0;           // of the sum over the plan's launches
  double bytes = 0;           // sizes of the tensors and scratch buffers it is passed, each once
  double achieved_gbps = 0;   // bytes / time: as if each buffer it is passed moved once
  double flops = 0;           // the problem's FLOPS, only when the plan is this one launch
  double achieved_tflops = 0;
  double floor_ms = 0;        // max(bytes / measured bandwidth, flops / measured peak)
  double fraction_of_floor = 0;
  std::optional<Occupancy> occupancy;
};

// Fills the per-resource bounds and the limiter of `o` (its blocks_per_sm,
// threads_per_block, registers and shared_bytes set) from the SM's limits,
// with the allocation granularities of sm_70 and later (registers per warp in
// units of 256, shared memory per block in units of 128 bytes).
void ExplainOccupancy(const SmLimits& sm, Occupancy* o);

// The figures of each launch from its measured times (one series per launch,
// in plan order) and what each launch is passed. `launch_bytes[i]` is the byte
// count of launch i's buffers; `plan_flops` the problem's FLOPS (0: none);
// peaks 0 where not measured.
std::vector<LaunchProfile> BuildLaunchProfiles(const std::vector<std::string>& kernels,
                                               const std::vector<std::vector<double>>& launch_ms,
                                               const std::vector<double>& launch_bytes, double plan_flops,
                                               double peak_gbps, double peak_tflops,
                                               const std::vector<std::optional<Occupancy>>& occupancy);

// One line per launch, plain text, as `kernelsearch eval` and the prompts show it.
std::string LaunchProfileText(const std::vector<LaunchProfile>& profiles, const std::string& bullet);

nlohmann::json LaunchProfilesToJson(const std::vector<LaunchProfile>& p);
std::vector<LaunchProfile> LaunchProfilesFromJson(const nlohmann::json& j);

}  // namespace ks
