#include "evaluator/profile/roofline.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

namespace ks {
namespace {

std::string Fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string Ms(double ms) { return ms >= 1 ? Fmt("%.3f ms", ms) : Fmt("%.1f us", ms * 1e3); }

std::string Flop(double f) {
  if (f >= 1e12) return Fmt("%.3g TFLOP", f / 1e12);
  if (f >= 1e9) return Fmt("%.3g GFLOP", f / 1e9);
  return Fmt("%.3g MFLOP", f / 1e6);
}

}  // namespace

Fp32Path FastestFp32Path(const DevicePeaks& peaks, Contract contract) {
  std::vector<Fp32Path> paths = {{peaks.For("fp32"), "fp32"},
                                 {peaks.For("tf32") / 3, "3xTF32"},
                                 {peaks.For("fp16") / 3, "3xFP16"}};
  if (contract != Contract::kHighest) paths.push_back({peaks.For("tf32"), "TF32"});
  if (contract == Contract::kMedium || contract == Contract::kKernelBench) paths.push_back({peaks.For("bf16"), "BF16"});
  if (contract == Contract::kKernelBench) paths.push_back({peaks.For("fp16"), "FP16"});
  Fp32Path best;
  for (const auto& p : paths)
    if (p.tflops > best.tflops) best = p;
  return best;
}

double ClassPeakTflops(const DevicePeaks& peaks, const std::string& compute_class, Contract contract) {
  return compute_class == "fp32" ? FastestFp32Path(peaks, contract).tflops : peaks.For(compute_class);
}

Roofline PlanRoofline(const Signature& sig, double peak_gbps, const DevicePeaks* peaks, double override_tflops,
                      Contract contract) {
  Roofline rf;
  rf.bytes = static_cast<double>(sig.MinimumBytes());
  rf.flops = sig.flops.value_or(0);
  rf.flops_source = sig.flops_source;
  rf.flops_note = sig.flops_note;
  rf.peak_gbps = peak_gbps;
  rf.memory_floor_ms = peak_gbps > 0 ? rf.bytes / (peak_gbps * 1e9) * 1e3 : 0;
  if (peaks) {
    rf.peak_fp32_tflops = peaks->For("fp32");
    rf.peak_tf32_tflops = peaks->For("tf32");
  }
  if (rf.flops > 0 && (peaks || override_tflops > 0)) {
    // FLOPs by class: the bridge's split, or (a FLOPS figure) all of them in
    // the class of the outputs' dtype.
    std::map<std::string, double> by_class = sig.flops_by_class;
    double split = 0;
    for (const auto& [cls, f] : by_class) split += f;
    if (by_class.empty() || split <= 0) by_class = {{ComputeClassFor(sig), rf.flops}};
    else if (split != rf.flops)
      for (auto& [cls, f] : by_class) f *= rf.flops / split;  // the declared total, split as counted
    double seconds = 0, bounded_flops = 0;
    std::vector<std::string> classes;
    for (const auto& [cls, f] : by_class) {
      double peak = override_tflops > 0 ? override_tflops : peaks ? ClassPeakTflops(*peaks, cls, contract) : 0;
      if (peak <= 0) continue;  // not measured (fp64, int8): that part bounds nothing
      seconds += f / (peak * 1e12);
      bounded_flops += f;
      classes.push_back(cls);
      if (cls == "fp32" && override_tflops <= 0 && peaks) rf.fp32_path = FastestFp32Path(*peaks, contract).name;
    }
    if (seconds > 0) {
      rf.compute_floor_ms = seconds * 1e3;
      rf.peak_tflops = bounded_flops / seconds / 1e12;
      rf.compute_class = classes.size() == 1 ? classes[0] : "mixed";
    }
  }
  rf.floor_ms = std::max(rf.memory_floor_ms, rf.compute_floor_ms);
  rf.bound = rf.compute_floor_ms > rf.memory_floor_ms ? "compute" : "memory";
  return rf;
}

void FinishRoofline(double median_ms, Roofline* rf) {
  const double sec = median_ms * 1e-3;
  rf->achieved_gbps = sec > 0 ? rf->bytes / sec / 1e9 : 0;
  rf->achieved_tflops = sec > 0 ? rf->flops / sec / 1e12 : 0;
  rf->fraction_of_floor = median_ms > 0 ? rf->floor_ms / median_ms : 0;
}

std::string RooflineFloorText(const Roofline& r) {
  if (r.memory_floor_ms <= 0 && r.compute_floor_ms <= 0)  // stored before both floors were kept
    return Fmt("floor from %.0f GB/s measured%s (%s-bound)", r.peak_gbps,
               r.peak_tflops > 0 ? Fmt(" and %.1f TFLOP/s %s matmul measured", r.peak_tflops, r.compute_class.c_str()).c_str()
                                 : "",
               r.bound.c_str());
  std::string out = Fmt("memory floor %s (%.0f GB/s measured)", Ms(r.memory_floor_ms).c_str(), r.peak_gbps);
  if (r.compute_floor_ms > 0) {
    out += Fmt("; compute floor %s: %s %s (%s) at %.1f TFLOP/s", Ms(r.compute_floor_ms).c_str(), Flop(r.flops).c_str(),
               r.flops_source == "FLOPS" ? "declared" : "counted", r.compute_class.c_str(), r.peak_tflops);
    if (!r.fp32_path.empty()) {
      if (r.fp32_path == "3xTF32")
        out += Fmt(", fp32 via 3xTF32 (TF32 %.0f TFLOP/s measured / 3; fp32 matmul %.1f TFLOP/s measured)",
                   r.peak_tf32_tflops, r.peak_fp32_tflops);
      else if (r.fp32_path == "fp32")
        out += Fmt(", fp32 matmul measured (TF32 %.0f TFLOP/s / 3 is slower)", r.peak_tf32_tflops);
      else if (r.fp32_path == "3xFP16")
        out += ", fp32 via a scaled 3xFP16 split (FP16 peak measured / 3: the fastest fp32-accurate method here)";
      else
        out += Fmt(", fp32 work at %s (the fastest method the precision contract admits)", r.fp32_path.c_str());
    }
  } else if (r.flops > 0) {
    out += Fmt("; no compute floor (%s, no measured peak for its class)", Flop(r.flops).c_str());
  } else if (r.flops_source == "counted") {
    out += "; no compute floor (no matmul, convolution or attention FLOPs counted)";
  } else {
    out += "; no compute floor (FLOPs unknown)";
  }
  out += Fmt(" -> %s-bound", r.bound.c_str());
  if (!r.flops_note.empty()) out += "\n" + r.flops_note;
  return out;
}

}  // namespace ks
