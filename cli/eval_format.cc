#include "cli/eval_format.h"

#include <algorithm>
#include <cstdio>

#include "evaluator/judge/judge.h"
#include "evaluator/profile/launch_profile.h"
#include "evaluator/profile/roofline.h"

namespace ks::cli {
namespace {
std::string Ms(double ms) {
  char buf[32];
  if (ms >= 1) std::snprintf(buf, sizeof buf, "%.3f ms", ms);
  else std::snprintf(buf, sizeof buf, "%.1f us", ms * 1e3);
  return buf;
}
}  // namespace

void PrintRobustness(const Robustness& r) {
  std::printf("inputs:   %s\n", r.Summary().c_str());
  for (const auto& c : r.checks)
    std::printf("          %-11s %-12s %s\n", c.check.c_str(), c.outcome.c_str(), c.detail.c_str());
}

std::string StatusText(const Evaluation& e) {
  return std::string(EvalStatusName(e.status)) + (e.specialised() ? " (specialised)" : "");
}

void PrintEvaluation(const Evaluation& e) {
  std::printf("status:   %s\n", StatusText(e).c_str());
  if (!e.message.empty()) std::printf("message:  %s\n", e.message.c_str());
  if (e.robustness) PrintRobustness(*e.robustness);
  if (!e.device.empty()) std::printf("device:   %s\n", e.device.c_str());
  if (!e.target.empty()) std::printf("target:   %s\n", e.target.c_str());
  if (e.timing) {
    const auto& t = *e.timing;
    std::printf("time:     median %s (mean %s, min %s, max %s, sd %s, %d runs)\n", Ms(t.median_ms).c_str(),
                Ms(t.mean_ms).c_str(), Ms(t.min_ms).c_str(), Ms(t.max_ms).c_str(), Ms(t.stddev_ms).c_str(), t.runs);
    if (t.cut_short())
      std::printf("          cut short: clearly slower than the best candidate so far, so fewer runs were made\n");
  }
  if (e.eager) {
    std::printf("eager:    median %s", Ms(e.eager->median_ms).c_str());
    if (e.speedup_eager) std::printf("  -> speedup %.2fx", *e.speedup_eager);
    std::printf("\n");
  }
  if (e.compiled) {
    std::printf("compiled: median %s", Ms(e.compiled->median_ms).c_str());
    if (e.speedup_compile) std::printf("  -> speedup %.2fx", *e.speedup_compile);
    std::printf("  (torch.compile)\n");
  }
  if (e.eager_fp32) {
    std::printf("eager fp32: median %s", Ms(e.eager_fp32->median_ms).c_str());
    if (e.speedup_eager_fp32) std::printf("  -> speedup %.2fx", *e.speedup_eager_fp32);
    std::printf("  (PyTorch eager with TF32 off)\n");
  }
  if (e.speedup_best) std::printf("best:     speedup %.2fx against the faster of eager and torch.compile\n", *e.speedup_best);
  if (!e.precision.empty())
    std::printf("precision: contract %s (the speedups above are under it); %s\n",
                CanonicalContract(e.precision).c_str(), e.baseline.c_str());
  if (e.roofline) {
    const auto& r = *e.roofline;
    std::printf("roofline: %.3g MB must move, %.0f GB/s achieved", r.bytes / 1e6, r.achieved_gbps);
    if (r.flops > 0) std::printf(", %.2f TFLOP/s", r.achieved_tflops);
    std::printf("; floor %s, %.0f%% of it reached\n", Ms(r.floor_ms).c_str(), r.fraction_of_floor * 100);
    // Both floors, the bound and every measured peak the floor rests on.
    std::string floors = RooflineFloorText(r);
    for (size_t at = 0; at <= floors.size();) {
      size_t nl = std::min(floors.find('\n', at), floors.size());
      std::printf("          %s\n", floors.substr(at, nl - at).c_str());
      at = nl + 1;
    }
  }
  if (!e.errors.empty()) {
    std::printf("\n%-14s %4s %11s %11s %11s %11s %11s %10s\n", "output", "set", "max abs", "max rel", "rel norm",
                "mismatches", "first", "unwritten");
    for (const auto& o : e.errors)
      std::printf("%-14s %4d %11.3g %11.3g %11.3g %11lld %11lld %10lld\n", o.name.c_str(), o.input_set, o.max_abs,
                  o.max_rel, o.rel_norm, static_cast<long long>(o.mismatches),
                  static_cast<long long>(o.first_mismatch), static_cast<long long>(o.unwritten));
    // The norm rules beside the element-wise ones: how far inside its bounds each output is.
    for (const auto& o : e.errors) {
      if (o.rel_norm_bound <= 0) continue;
      double share = o.considered ? static_cast<double>(o.large_errors) / o.considered : 0;
      std::printf("%-14s rel norm %.3g of %.3g allowed (%.2g%%); relative error > %.3g on %lld of %lld "
                  "non-tiny elements (%.3g%%, at most %.3g%%)\n",
                  o.name.c_str(), o.rel_norm, o.rel_norm_bound, 100 * o.rel_norm / o.rel_norm_bound, o.large_rel,
                  static_cast<long long>(o.large_errors), static_cast<long long>(o.considered), 100 * share,
                  100 * o.large_share_cap);
    }
  }
  if (!e.resources.empty()) {
    std::printf("\n%-28s %9s %12s %12s %13s\n", "kernel", "registers", "static smem", "stack frame", "spill st/ld");
    for (const auto& k : e.resources)
      std::printf("%-28s %9d %12d %12d %6d/%-6d\n", k.kernel.c_str(), k.registers, k.static_shared_bytes,
                  k.stack_frame_bytes, k.spill_store_bytes, k.spill_load_bytes);
  }
  if (!e.launches.empty()) {
    std::printf("\n%-28s %-24s %-18s %s\n", "launch", "grid", "block", "dynamic smem");
    for (const auto& l : e.launches) {
      char g[64], b[64];
      std::snprintf(g, sizeof g, "(%lld, %lld, %lld)", (long long)l.grid[0], (long long)l.grid[1], (long long)l.grid[2]);
      std::snprintf(b, sizeof b, "(%lld, %lld, %lld)", (long long)l.block[0], (long long)l.block[1], (long long)l.block[2]);
      std::printf("%-28s %-24s %-18s %lld\n", l.kernel.c_str(), g, b, (long long)l.shared_bytes);
    }
  }
  if (!e.launch_profiles.empty()) {
    std::printf("\neach launch on its own (separate runs with events between launches):\n%s",
                LaunchProfileText(e.launch_profiles, "  ").c_str());
  }
  if (e.counters) {
    std::printf("\nhardware counters (Nsight Compute, one more verified run");
    if (e.counters->seconds > 0) std::printf(", %.1f s", e.counters->seconds);
    std::printf("):\n%s", CountersText(*e.counters, "  ", 20000).c_str());
    if (!e.counters->launches.empty() && !e.counters->note.empty())
      std::printf("  note: %s\n", e.counters->note.c_str());
  }
  if (e.status == EvalStatus::kCompileError && !e.compile_log.empty())
    std::printf("\ncompiler log:\n%s\n", e.compile_log.c_str());
  if (!e.worker_log.empty()) std::printf("\nworker output (device printf):\n%s\n", e.worker_log.c_str());
}

void PrintBatchHeader() {
  std::printf("%-32s %-22s %12s %9s %9s %-11s  %s\n", "candidate", "status", "median", "vs eager", "vs comp.",
              "contract", "message");
}

void PrintBatchRow(const std::string& name, const std::string& status, const Evaluation* e, const std::string& message) {
  std::string med = e && e->timing ? Ms(e->timing->median_ms) : "-";
  char se[16] = "-", sc[16] = "-";
  if (e && e->speedup_eager) std::snprintf(se, sizeof se, "%.2fx", *e->speedup_eager);
  if (e && e->speedup_compile) std::snprintf(sc, sizeof sc, "%.2fx", *e->speedup_compile);
  std::string msg = message.size() > 100 ? message.substr(0, 97) + "..." : message;
  const std::string contract = e && !e->precision.empty() ? CanonicalContract(e->precision) : "-";
  std::printf("%-32s %-22s %12s %9s %9s %-11s  %s\n", name.c_str(), status.c_str(), med.c_str(), se, sc,
              contract.c_str(), msg.c_str());
}

}  // namespace ks::cli
