#include "evaluator/profile/counters.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <unistd.h>

#include "common/subprocess.h"

namespace ks {
namespace {

using json = nlohmann::json;

std::string Fmt(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

bool Exists(const std::string& path) { return !path.empty() && access(path.c_str(), X_OK) == 0; }

// One CSV record (RFC 4180 quoting, as ncu writes it).
std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

// "1,234.5" -> 1234.5; "n/a", "" -> nullopt.
std::optional<double> Number(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The factor of a unit's metric prefix: "Gbyte/second" -> 1e9, "nsecond" -> 1e-9.
double PrefixScale(const std::string& unit, const std::string& base) {
  if (unit.size() <= base.size() || unit.compare(unit.size() - base.size(), base.size(), base) != 0) return 1;
  std::string p = unit.substr(0, unit.size() - base.size());
  static const std::map<std::string, double> kPrefix = {{"n", 1e-9}, {"u", 1e-6}, {"m", 1e-3}, {"K", 1e3},
                                                        {"k", 1e3},  {"M", 1e6},  {"G", 1e9},  {"T", 1e12}};
  auto it = kPrefix.find(p);
  return it == kPrefix.end() ? 1 : it->second;
}

// The metrics of one profiled kernel: name -> (value, unit).
using Metrics = std::map<std::string, std::pair<double, std::string>>;

double Get(const Metrics& m, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = m.find(n);
    if (it != m.end()) return it->second.first;
  }
  return -1;
}

double Seconds(const Metrics& m, const char* name) {
  auto it = m.find(name);
  if (it == m.end()) return -1;
  const std::string& u = it->second.second;
  if (u.find("second") != std::string::npos) return it->second.first * PrefixScale(u, "second");
  return it->second.first * 1e-9;  // ncu's base unit for durations
}

double BytesPerSecond(const Metrics& m, const char* name) {
  auto it = m.find(name);
  if (it == m.end()) return -1;
  const std::string& u = it->second.second;
  double v = it->second.first;
  if (u.find("/second") != std::string::npos) {
    std::string bytes = u.substr(0, u.find("/second"));
    v *= PrefixScale(bytes, "byte");
  } else if (u.find("/usecond") != std::string::npos) {
    v *= PrefixScale(u.substr(0, u.find("/usecond")), "byte") * 1e6;
  }
  return v;
}

// The counters the digest needs, from one kernel's metrics. Names are those
// of ncu's sections on sm_70 and later; where several spell one figure (they
// changed across ncu versions), the first present is taken.
LaunchCounters FromMetrics(const Metrics& m) {
  LaunchCounters c;
  double dur = Seconds(m, "gpu__time_duration.sum");
  c.duration_ms = dur >= 0 ? dur * 1e3 : -1;
  c.dram_pct = Get(m, {"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                       "dram__throughput.avg.pct_of_peak_sustained_elapsed"});
  double dram = BytesPerSecond(m, "dram__bytes.sum.per_second");
  c.dram_gbps = dram >= 0 ? dram / 1e9 : -1;
  c.l2_pct = Get(m, {"lts__throughput.avg.pct_of_peak_sustained_elapsed"});
  double l2 = BytesPerSecond(m, "lts__t_bytes.sum.per_second");
  if (l2 < 0) {
    double bytes = Get(m, {"lts__t_bytes.sum"});
    if (bytes >= 0 && dur > 0) l2 = bytes / dur;
  }
  c.l2_gbps = l2 >= 0 ? l2 / 1e9 : -1;
  c.sm_pct = Get(m, {"sm__throughput.avg.pct_of_peak_sustained_elapsed"});
  c.achieved_occupancy_pct = Get(m, {"sm__warps_active.avg.pct_of_peak_sustained_active"});
  c.theoretical_occupancy_pct = Get(m, {"sm__maximum_warps_per_active_cycle_pct"});
  c.l1_hit_pct = Get(m, {"l1tex__t_sector_hit_rate.pct"});
  c.l2_hit_pct = Get(m, {"lts__t_sector_hit_rate.pct"});
  double conflicts_ld = -1, conflicts_st = -1, conflicts_all = -1, wavefronts = -1, local = -1;
  std::map<std::string, double> stalls;
  for (const auto& [name, vu] : m) {
    const double v = vu.first;
    // Tensor pipes: mma.sync (hmma/imma), wgmma (gmma), by cycles or by
    // instructions; the busiest is the figure.
    if ((name.rfind("sm__pipe_tensor", 0) == 0 || name.rfind("sm__inst_executed_pipe_tensor", 0) == 0) &&
        name.find("pct_of_peak_sustained_active") != std::string::npos)
      c.tensor_pct = std::max(c.tensor_pct, v);
    // Stall reasons, in cycles per issued instruction: shares of their sum.
    size_t at = name.find("issue_stalled_");
    if (name.rfind("smsp__average_warp", 0) == 0 && at != std::string::npos &&
        name.find("_per_issue_active.ratio") != std::string::npos) {
      std::string reason = name.substr(at + 14, name.find("_per_issue_active") - at - 14);
      // "selected" is issuing, not a stall; "*_not_issued" repeats a reason's cycles.
      bool repeat = reason.size() > 11 && reason.compare(reason.size() - 11, 11, "_not_issued") == 0;
      if (reason != "selected" && !repeat && v > 0) stalls[reason] = v;
    }
    if (name == "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum") conflicts_ld = v;
    if (name == "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum") conflicts_st = v;
    if (name == "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum") conflicts_all = v;
    if (name == "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum") wavefronts = v;
    if (name == "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum" || name == "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum")
      local = std::max(local, 0.0) + 32 * v;  // 32-byte sectors
  }
  if (conflicts_all >= 0)
    c.shared_bank_conflicts = conflicts_all;  // loads and stores
  else if (conflicts_ld >= 0 || conflicts_st >= 0)
    c.shared_bank_conflicts = std::max(conflicts_ld, 0.0) + std::max(conflicts_st, 0.0);
  c.shared_wavefronts = wavefronts;
  c.local_bytes = local;
  double total = 0;
  for (const auto& [r, v] : stalls) total += v;
  for (const auto& [r, v] : stalls) c.stalls.push_back({r, total > 0 ? v / total : 0});
  std::sort(c.stalls.begin(), c.stalls.end(), [](const WarpStall& a, const WarpStall& b) {
    return a.share != b.share ? a.share > b.share : a.reason < b.reason;
  });
  if (c.stalls.size() > 4) c.stalls.resize(4);
  return c;
}

std::string Pct(double v) { return v < 0 ? "n/a" : Fmt("%.0f%%", v); }

std::string Reason(std::string r) {
  std::replace(r.begin(), r.end(), '_', ' ');
  return r;
}

}  // namespace

std::string FindNcu() {
  // $KS_NCU names the ncu to use; "none" (or empty) turns counters off.
  if (const char* v = getenv("KS_NCU")) {
    std::string s = v;
    return s == "none" || s.empty() ? "" : s;
  }
  if (auto p = FindOnPath("ncu")) return *p;
  for (const char* dir : {static_cast<const char*>(getenv("CUDA_HOME")), static_cast<const char*>(getenv("CUDA_PATH")),
                          "/usr/local/cuda"}) {
    if (!dir || !*dir) continue;
    std::string p = std::string(dir) + "/bin/ncu";
    if (Exists(p)) return p;
  }
  return "";
}

const std::vector<std::string>& NcuSections() {
  static const std::vector<std::string> kSections = {
      "SpeedOfLight",   "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables", "Occupancy",
      "WarpStateStats", "ComputeWorkloadAnalysis", "LaunchStats"};
  return kSections;
}

const std::vector<std::string>& NcuExtraMetrics() {
  static const std::vector<std::string> kMetrics = {
      "lts__t_bytes.sum.per_second",
      "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
      "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active",
      "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
      "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
      "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
      "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
      "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"};
  return kMetrics;
}

std::vector<std::string> NcuCommand(const std::string& ncu, const std::string& log_file,
                                    const std::vector<std::string>& kernels, int launches,
                                    const std::vector<std::string>& worker_argv, bool extra_metrics) {
  std::vector<std::string> names = kernels;
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::string regex = "regex:^(";
  for (size_t i = 0; i < names.size(); ++i) regex += (i ? "|" : "") + names[i];
  regex += ")$";
  std::vector<std::string> argv = {ncu, "--target-processes", "all", "--kernel-name", regex,
                                   // One profiled run: each launch of the plan once. The
                                   // worker's own kernels (poison, scrub, flush) are not named.
                                   "--launch-count", std::to_string(std::max(launches, 1)),
                                   // Measure the card as it is: ncu would otherwise lock
                                   // its clocks to base for the profile.
                                   "--clock-control", "none", "--page", "raw", "--csv", "--print-units", "base",
                                   "--log-file", log_file};
  for (const auto& s : NcuSections()) {
    argv.push_back("--section");
    argv.push_back(s);
  }
  // What the sections may leave out: tensor-pipe use, shared-memory bank
  // conflicts, local-memory (spill) traffic.
  if (extra_metrics) {
    std::string extra;
    for (const auto& m : NcuExtraMetrics()) extra += (extra.empty() ? "" : ",") + m;
    argv.push_back("--metrics");
    argv.push_back(extra);
  }
  argv.insert(argv.end(), worker_argv.begin(), worker_argv.end());
  return argv;
}

bool NcuRefusedAMetric(const std::string& log) {
  for (const char* key : {"Failed to find metric", "metric not found", "Invalid metric", "invalid metric"})
    if (log.find(key) != std::string::npos) return true;
  return false;
}

std::string NcuFailureReason(const std::string& log) {
  if (log.find("ERR_NVGPUCTRPERM") != std::string::npos)
    return "ncu may not read the GPU's performance counters (ERR_NVGPUCTRPERM: profiling is restricted to admin "
           "users on this machine; NVreg_RestrictProfilingToAdminUsers=0 or running as root allows it)";
  for (const char* key : {"==ERROR==", "==PROF== Error", "Failed to"}) {
    size_t at = log.find(key);
    if (at != std::string::npos) {
      size_t end = log.find('\n', at);
      return "ncu: " + log.substr(at, std::min<size_t>(end == std::string::npos ? log.size() : end, at + 300) - at);
    }
  }
  if (log.find("No kernels were profiled") != std::string::npos) return "ncu profiled no kernel of the plan";
  return "";
}

StatusOr<std::vector<LaunchCounters>> ParseNcuCsv(const std::string& text,
                                                  const std::vector<std::string>& plan_kernels) {
  std::vector<std::string> lines = Lines(text);
  size_t h = 0;
  while (h < lines.size() && lines[h].find("\"Kernel Name\"") == std::string::npos) ++h;
  if (h == lines.size()) {
    std::string why = NcuFailureReason(text);
    return Internal(why.empty() ? "ncu wrote no metrics table" : why);
  }
  std::vector<std::string> header = SplitCsv(lines[h]);
  auto col = [&](const std::string& n) -> int {
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == n) return static_cast<int>(i);
    return -1;
  };
  const int kname = col("Kernel Name"), mname = col("Metric Name"), mval = col("Metric Value"),
            munit = col("Metric Unit"), id = col("ID");
  std::vector<std::pair<std::string, Metrics>> kernels;  // in profiled order
  if (mname >= 0 && mval >= 0) {
    // The long form (--page details): one row per metric, grouped by ID.
    std::map<std::string, size_t> by_id;
    for (size_t i = h + 1; i < lines.size(); ++i) {
      auto f = SplitCsv(lines[i]);
      if (static_cast<int>(f.size()) <= std::max({kname, mname, mval})) continue;
      std::string key = id >= 0 ? f[id] : f[kname];
      auto [it, fresh] = by_id.emplace(key, kernels.size());
      if (fresh) kernels.push_back({f[kname], {}});
      if (auto v = Number(f[mval])) kernels[it->second].second[f[mname]] = {*v, munit >= 0 ? f[munit] : ""};
    }
  } else {
    // The raw page: metric names across, a row of units, then a row per kernel.
    size_t first = h + 1;
    std::vector<std::string> units;
    if (first < lines.size()) {
      auto f = SplitCsv(lines[first]);
      if (kname < static_cast<int>(f.size()) && kname >= 0 && f[kname].empty()) {
        units = f;
        ++first;
      }
    }
    for (size_t i = first; i < lines.size(); ++i) {
      auto f = SplitCsv(lines[i]);
      if (kname < 0 || static_cast<int>(f.size()) <= kname || f.size() < header.size() / 2) continue;
      Metrics m;
      for (size_t c = 0; c < f.size() && c < header.size(); ++c)
        if (header[c].find("__") != std::string::npos)
          if (auto v = Number(f[c])) m[header[c]] = {*v, c < units.size() ? units[c] : ""};
      kernels.push_back({f[kname], std::move(m)});
    }
  }
  if (kernels.empty()) return Internal("ncu profiled no kernel of the plan");
  std::vector<LaunchCounters> out;
  for (size_t i = 0; i < kernels.size() && i < std::max<size_t>(plan_kernels.size(), 1); ++i) {
    LaunchCounters c = FromMetrics(kernels[i].second);
    c.index = static_cast<int>(i);
    // ncu may print a demangled signature ("k(float*, int)"): the plan's name is the one shown.
    c.kernel = i < plan_kernels.size() ? plan_kernels[i] : kernels[i].first;
    out.push_back(std::move(c));
  }
  return out;
}

std::string CountersDigest(const LaunchCounters& c) {
  std::vector<std::string> parts;
  if (c.duration_ms >= 0) parts.push_back(Fmt("%.4f ms", c.duration_ms));
  std::string dram = "DRAM " + Pct(c.dram_pct) + " of peak";
  if (c.dram_gbps >= 0) dram += Fmt(" (%.0f GB/s)", c.dram_gbps);
  parts.push_back(dram);
  std::string l2 = "L2 " + Pct(c.l2_pct);
  if (c.l2_gbps >= 0) l2 += Fmt(" (%.0f GB/s)", c.l2_gbps);
  parts.push_back(l2);
  parts.push_back("L1 hit " + Pct(c.l1_hit_pct) + ", L2 hit " + Pct(c.l2_hit_pct));
  parts.push_back("SM " + Pct(c.sm_pct) + ", tensor pipe " + Pct(c.tensor_pct));
  if (c.achieved_occupancy_pct >= 0)
    parts.push_back("occupancy " + Pct(c.achieved_occupancy_pct) + " achieved of " +
                    Pct(c.theoretical_occupancy_pct) + " theoretical");
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  if (!c.stalls.empty()) {
    out += "; stalls:";
    for (size_t i = 0; i < c.stalls.size() && i < 3; ++i)
      out += (i ? ", " : " ") + Reason(c.stalls[i].reason) + Fmt(" %.0f%%", 100 * c.stalls[i].share);
  }
  if (c.shared_bank_conflicts >= 0) {
    out += Fmt("; shared-memory bank conflicts %.0f", c.shared_bank_conflicts);
    if (c.shared_wavefronts > 0) out += Fmt(" (%.0f wavefronts)", c.shared_wavefronts);
  }
  if (c.local_bytes > 0) out += Fmt("; local-memory (spill) traffic %.0f KB", c.local_bytes / 1e3);
  return out;
}

std::string CountersText(const CounterReport& r, const std::string& bullet, size_t max_chars) {
  std::string out;
  for (size_t i = 0; i < r.launches.size(); ++i) {
    const LaunchCounters& c = r.launches[i];
    std::string line = bullet + "launch " + std::to_string(c.index) + " `" + c.kernel + "`: " + CountersDigest(c) + "\n";
    if (out.size() + line.size() > max_chars) {
      out += bullet + "... " + std::to_string(r.launches.size() - i) + " more launches (not shown)\n";
      break;
    }
    out += line;
  }
  if (r.launches.empty() && !r.note.empty()) out += bullet + "no hardware counters: " + r.note + "\n";
  return out;
}

json CounterReportToJson(const CounterReport& r) {
  json j{{"note", r.note}, {"seconds", r.seconds}, {"launches", json::array()}};
  for (const auto& c : r.launches) {
    json s = json::array();
    for (const auto& w : c.stalls) s.push_back({{"reason", w.reason}, {"share", w.share}});
    j["launches"].push_back({{"index", c.index},
                             {"kernel", c.kernel},
                             {"duration_ms", c.duration_ms},
                             {"dram_gbps", c.dram_gbps},
                             {"dram_pct", c.dram_pct},
                             {"l2_gbps", c.l2_gbps},
                             {"l2_pct", c.l2_pct},
                             {"sm_pct", c.sm_pct},
                             {"tensor_pct", c.tensor_pct},
                             {"achieved_occupancy_pct", c.achieved_occupancy_pct},
                             {"theoretical_occupancy_pct", c.theoretical_occupancy_pct},
                             {"stalls", s},
                             {"l1_hit_pct", c.l1_hit_pct},
                             {"l2_hit_pct", c.l2_hit_pct},
                             {"shared_bank_conflicts", c.shared_bank_conflicts},
                             {"shared_wavefronts", c.shared_wavefronts},
                             {"local_bytes", c.local_bytes}});
  }
  return j;
}

CounterReport CounterReportFromJson(const json& j) {
  CounterReport r;
  if (!j.is_object()) return r;
  r.note = j.value("note", "");
  r.seconds = j.value("seconds", 0.0);
  for (const auto& l : j.value("launches", json::array())) {
    LaunchCounters c;
    c.index = l.value("index", 0);
    c.kernel = l.value("kernel", "");
    c.duration_ms = l.value("duration_ms", -1.0);
    c.dram_gbps = l.value("dram_gbps", -1.0);
    c.dram_pct = l.value("dram_pct", -1.0);
    c.l2_gbps = l.value("l2_gbps", -1.0);
    c.l2_pct = l.value("l2_pct", -1.0);
    c.sm_pct = l.value("sm_pct", -1.0);
    c.tensor_pct = l.value("tensor_pct", -1.0);
    c.achieved_occupancy_pct = l.value("achieved_occupancy_pct", -1.0);
    c.theoretical_occupancy_pct = l.value("theoretical_occupancy_pct", -1.0);
    for (const auto& w : l.value("stalls", json::array())) c.stalls.push_back({w.value("reason", ""), w.value("share", 0.0)});
    c.l1_hit_pct = l.value("l1_hit_pct", -1.0);
    c.l2_hit_pct = l.value("l2_hit_pct", -1.0);
    c.shared_bank_conflicts = l.value("shared_bank_conflicts", -1.0);
    c.shared_wavefronts = l.value("shared_wavefronts", -1.0);
    c.local_bytes = l.value("local_bytes", -1.0);
    r.launches.push_back(std::move(c));
  }
  return r;
}

}  // namespace ks
