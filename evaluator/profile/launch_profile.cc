#include "evaluator/profile/launch_profile.h"

#include <algorithm>
#include <climits>
#include <cstdio>

namespace ks {
namespace {

using json = nlohmann::json;

constexpr int kWarp = 32;
constexpr int kRegisterUnit = 256;   // registers are allocated per warp in these units
constexpr int64_t kSharedUnit = 128; // shared memory per block is rounded up to this

int64_t RoundUp(int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string Bytes(double b) {
  if (b >= 1 << 20) return Fmt("%.1f MiB", b / 1048576.0);
  if (b >= 1024) return Fmt("%.1f KiB", b / 1024.0);
  return Fmt("%.0f B", b);
}

std::string Bound(int v) { return v < 0 ? "?" : std::to_string(v); }

}  // namespace

void ExplainOccupancy(const SmLimits& sm, Occupancy* o) {
  const int warps = (o->threads_per_block + kWarp - 1) / kWarp;
  if (warps <= 0) return;
  o->by_threads = sm.max_threads_per_sm > 0 ? sm.max_threads_per_sm / (warps * kWarp) : -1;
  o->by_block_limit = sm.max_blocks_per_sm > 0 ? sm.max_blocks_per_sm : -1;
  if (sm.registers_per_sm > 0) {
    if (o->registers <= 0) {
      o->by_registers = INT_MAX;  // uses none: never the limit
    } else {
      int64_t per_warp = RoundUp(int64_t{o->registers} * kWarp, kRegisterUnit);
      int64_t per_block = per_warp * warps;
      if (sm.max_registers_per_block > 0 && per_block > sm.max_registers_per_block) {
        o->by_registers = 0;
      } else {
        o->by_registers = static_cast<int>(sm.registers_per_sm / per_warp / warps);
      }
    }
  }
  if (sm.shared_per_sm > 0) {
    int64_t per_block = o->shared_bytes + sm.reserved_shared_per_block;
    o->by_shared = per_block > 0 ? static_cast<int>(sm.shared_per_sm / RoundUp(per_block, kSharedUnit)) : INT_MAX;
  }
  // The limiter is the resource whose own bound is the smallest; where the
  // driver's answer is smaller still (a carve-out), the smallest bound is still
  // the resource to relieve first. On a tie the block's shape wins: a kernel at
  // the thread limit is at full occupancy whatever its registers allow.
  struct Named { const char* name; int bound; };
  const Named all[] = {{"threads", o->by_threads}, {"block limit", o->by_block_limit},
                       {"registers", o->by_registers}, {"shared memory", o->by_shared}};
  int best = INT_MAX;
  for (const auto& n : all)
    if (n.bound >= 0 && n.bound < best) best = n.bound, o->limiter = n.name;
  // A bound of "never the limit" is not a figure to print.
  if (o->by_registers == INT_MAX) o->by_registers = -1;
  if (o->by_shared == INT_MAX) o->by_shared = -1;
  if (sm.max_threads_per_sm > 0)
    o->warps_fraction = static_cast<double>(o->blocks_per_sm) * warps * kWarp / sm.max_threads_per_sm;
}

std::vector<LaunchProfile> BuildLaunchProfiles(const std::vector<std::string>& kernels,
                                               const std::vector<std::vector<double>>& launch_ms,
                                               const std::vector<double>& launch_bytes, double plan_flops,
                                               double peak_gbps, double peak_tflops,
                                               const std::vector<std::optional<Occupancy>>& occupancy) {
  std::vector<LaunchProfile> out;
  double total = 0;
  for (size_t i = 0; i < kernels.size(); ++i) {
    LaunchProfile p;
    p.index = static_cast<int>(i);
    p.kernel = kernels[i];
    if (i < launch_ms.size()) {
      p.median_ms = Median(launch_ms[i]);
      p.runs = static_cast<int>(launch_ms[i].size());
    }
    total += p.median_ms;
    p.bytes = i < launch_bytes.size() ? launch_bytes[i] : 0;
    // FLOPs belong to the plan as a whole; only a one-launch plan can say
    // which launch did them.
    if (kernels.size() == 1) p.flops = plan_flops;
    double sec = p.median_ms * 1e-3;
    if (sec > 0) {
      p.achieved_gbps = p.bytes / sec / 1e9;
      p.achieved_tflops = p.flops / sec / 1e12;
    }
    double floor_bw = peak_gbps > 0 ? p.bytes / (peak_gbps * 1e9) * 1e3 : 0;
    double floor_fl = peak_tflops > 0 ? p.flops / (peak_tflops * 1e12) * 1e3 : 0;
    p.floor_ms = std::max(floor_bw, floor_fl);
    p.fraction_of_floor = p.median_ms > 0 ? p.floor_ms / p.median_ms : 0;
    if (i < occupancy.size()) p.occupancy = occupancy[i];
    out.push_back(std::move(p));
  }
  for (auto& p : out) p.share = total > 0 ? p.median_ms / total : 0;
  return out;
}

std::string LaunchProfileText(const std::vector<LaunchProfile>& profiles, const std::string& bullet) {
  std::string out;
  for (const auto& p : profiles) {
    out += bullet + "launch " + std::to_string(p.index) + " `" + p.kernel + "`: " + Fmt("%.4f ms", p.median_ms) +
           Fmt(" (%.0f%% of the plan)", 100 * p.share);
    if (p.bytes > 0) {
      out += ", " + Fmt("%.0f GB/s", p.achieved_gbps) + " over the " + Bytes(p.bytes) + " of buffers it is passed";
      if (p.flops > 0) out += Fmt(", %.2f TFLOP/s", p.achieved_tflops);
      if (p.floor_ms > 0) out += Fmt(" (%.0f%% of its floor)", 100 * p.fraction_of_floor);
    }
    if (p.occupancy) {
      const Occupancy& o = *p.occupancy;
      out += "; occupancy " + std::to_string(o.blocks_per_sm) + " blocks/SM of " +
             std::to_string(o.threads_per_block) + " threads" + Fmt(" (%.0f%% of the SM's warps)", 100 * o.warps_fraction) +
             ", " + std::to_string(o.registers) + " registers/thread, " + Bytes(static_cast<double>(o.shared_bytes)) +
             " shared/block";
      if (!o.limiter.empty())
        out += "; limited by " + o.limiter + " (registers allow " + Bound(o.by_registers) + ", shared memory " +
               Bound(o.by_shared) + ", threads " + Bound(o.by_threads) + ", block limit " + Bound(o.by_block_limit) +
               ")";
      if (o.cluster_size > 0)
        out += "; clusters of " + std::to_string(o.cluster_size) + " blocks: " +
               (o.max_active_clusters >= 0 ? "at most " + std::to_string(o.max_active_clusters) + " resident on the GPU"
                                           : std::string("residency unknown"));
    }
    out += "\n";
  }
  return out;
}

json LaunchProfilesToJson(const std::vector<LaunchProfile>& ps) {
  json out = json::array();
  for (const auto& p : ps) {
    json j{{"index", p.index},       {"kernel", p.kernel},
           {"median_ms", p.median_ms}, {"runs", p.runs},
           {"share", p.share},       {"bytes", p.bytes},
           {"achieved_gbps", p.achieved_gbps}, {"flops", p.flops},
           {"achieved_tflops", p.achieved_tflops}, {"floor_ms", p.floor_ms},
           {"fraction_of_floor", p.fraction_of_floor}};
    if (p.occupancy) {
      const Occupancy& o = *p.occupancy;
      j["occupancy"] = {{"blocks_per_sm", o.blocks_per_sm},   {"threads_per_block", o.threads_per_block},
                        {"registers", o.registers},           {"shared_bytes", o.shared_bytes},
                        {"by_registers", o.by_registers},     {"by_shared", o.by_shared},
                        {"by_threads", o.by_threads},         {"by_block_limit", o.by_block_limit},
                        {"limiter", o.limiter},               {"warps_fraction", o.warps_fraction},
                        {"cluster_size", o.cluster_size},     {"max_active_clusters", o.max_active_clusters}};
    } else {
      j["occupancy"] = nullptr;
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<LaunchProfile> LaunchProfilesFromJson(const json& j) {
  std::vector<LaunchProfile> out;
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    if (!e.is_object()) continue;
    LaunchProfile p;
    p.index = e.value("index", 0);
    p.kernel = e.value("kernel", "");
    p.median_ms = e.value("median_ms", 0.0);
    p.runs = e.value("runs", 0);
    p.share = e.value("share", 0.0);
    p.bytes = e.value("bytes", 0.0);
    p.achieved_gbps = e.value("achieved_gbps", 0.0);
    p.flops = e.value("flops", 0.0);
    p.achieved_tflops = e.value("achieved_tflops", 0.0);
    p.floor_ms = e.value("floor_ms", 0.0);
    p.fraction_of_floor = e.value("fraction_of_floor", 0.0);
    if (e.contains("occupancy") && e["occupancy"].is_object()) {
      const json& o = e["occupancy"];
      Occupancy oc;
      oc.blocks_per_sm = o.value("blocks_per_sm", 0);
      oc.threads_per_block = o.value("threads_per_block", 0);
      oc.registers = o.value("registers", 0);
      oc.shared_bytes = o.value("shared_bytes", int64_t{0});
      oc.by_registers = o.value("by_registers", -1);
      oc.by_shared = o.value("by_shared", -1);
      oc.by_threads = o.value("by_threads", -1);
      oc.by_block_limit = o.value("by_block_limit", -1);
      oc.limiter = o.value("limiter", "");
      oc.warps_fraction = o.value("warps_fraction", 0.0);
      oc.cluster_size = o.value("cluster_size", 0);
      oc.max_active_clusters = o.value("max_active_clusters", -1);
      p.occupancy = oc;
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace ks
