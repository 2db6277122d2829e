#include "search/prompts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "evaluator/compile/compiler.h"
#include "evaluator/judge/judge.h"
#include "evaluator/profile/counters.h"
#include "evaluator/profile/launch_profile.h"

namespace ks {
namespace {

constexpr size_t kMaxLogChars = 6000;  // the first compiler errors are the ones that matter
// The hardware-counter digest of a kernel in a prompt: enough for a plan of a
// few launches (about 300 characters each), never a raw metric dump.
constexpr size_t kMaxCountersChars = 1200;

std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Capped(const std::string& text, size_t max_chars) {
  if (text.size() <= max_chars) return text;
  return text.substr(0, max_chars) + "\n[... " + std::to_string(text.size() - max_chars) + " more characters]";
}

std::string Bytes(int64_t b) {
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  if (b >= 1024) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", b);
}

std::string Timing(const TimingStats& t) {
  return fmt::format("median {:.4f} ms (min {:.4f}, max {:.4f}, stddev {:.4f}, {} runs)", t.median_ms, t.min_ms,
                     t.max_ms, t.stddev_ms, t.runs);
}

TemplateVars ProblemVars(const ProblemContext& p) {
  TemplateVars v;
  v.Set("problem_name", p.name.empty() ? p.signature.name : p.name);
  v.Set("problem_source", p.source);
  v.Set("signature_table", SignatureTable(p.signature));
  v.Set("gpu_facts", GpuFactsText(p.gpu));
  v.Set("launch_limits", LaunchLimitsText(p.gpu));
  v.Set("judging", p.judging.empty() ? DescribeContract(Contract::kHighest) : p.judging);
  // The Hopper section (TMA, wgmma) only for a GPU that has those: a list of
  // one record renders it once, an empty list not at all.
  v.SetList("hopper", HopperRecords(p.gpu));
  return v;
}

void SetParentVars(const ParentKernel& parent, TemplateVars* v) {
  if (parent.candidate) {
    v->Set("parent_description",
           "The best correct kernel so far in this lineage. Improve on it; you may also restructure it entirely.");
    v->Set("parent_code", "```cuda\n" + parent.candidate->source + "\n```\n\n```json\n" + parent.candidate->plan_json +
                              "\n```");
  } else {
    v->Set("parent_description",
           "No kernel yet: the starting point is the PyTorch reference above, run eagerly (and with "
           "torch.compile for comparison).");
    v->Set("parent_code", "(no kernel source yet)");
  }
  v->Set("parent_measurements", MeasurementsText(parent));
}

StatusOr<RenderedPrompt> Render(const PromptLibrary& lib, const std::string& name, const TemplateVars& v) {
  RenderedPrompt out;
  KS_ASSIGN_OR_RETURN(out.system, lib.Render("system", v));
  KS_ASSIGN_OR_RETURN(out.user, lib.Render(name, v));
  return out;
}

}  // namespace

LlmRequest RenderedPrompt::ToRequest(const std::string& role) const {
  LlmRequest r;
  r.role = role;
  r.system = system;
  r.prompt = user;
  return r;
}

std::string SignatureTable(const Signature& sig) {
  std::string out = "| kind | name | dtype | shape / value |\n|---|---|---|---|\n";
  auto rows = [&](const char* kind, const std::vector<TensorSpec>& specs) {
    for (const auto& t : specs) {
      std::string what = t.is_scalar ? fmt::format("scalar = {}", t.scalar_value)
                                     : Shape(t.shape) + " (" + std::to_string(t.numel()) + " elements, " +
                                           Bytes(t.bytes()) + ")";
      out += fmt::format("| {} | `{}` | {} | {} |\n", kind, t.name, DTypeName(t.dtype), what);
    }
  };
  rows("input", sig.inputs);
  rows("parameter", sig.parameters);
  rows("output", sig.outputs);
  out += fmt::format("\nMinimum memory traffic (every input and parameter read once, every output written once): {}.",
                     Bytes(sig.MinimumBytes()));
  if (sig.flops) out += fmt::format(" Useful work per call: {:.4g} FLOP.", *sig.flops);
  if (sig.tolerance) out += fmt::format(" Tolerance: atol {:g}, rtol {:g}.", sig.tolerance->atol, sig.tolerance->rtol);
  if (!sig.description.empty()) out += "\n\n" + sig.description;
  return out;
}

std::string GpuFactsText(const GpuFacts& g) {
  // A zero or blank figure would read as a fact ("0 SMs"); an unmeasured one is
  // said to be unknown instead (a split search before its GPU node reported).
  auto known = [](auto v, const std::string& text) { return v ? text : std::string("unknown"); };
  // Datasheet figures (a split search before its GPU node measured the GPU)
  // say so: bandwidth and peaks are the vendor's, not what a kernel reaches.
  const bool sheet = g.from_datasheet();
  std::string out = fmt::format("- {} (compute capability {}), {} SMs{}\n", g.name.empty() ? "GPU model unknown" : g.name,
                                g.compute_capability.empty() ? "unknown" : g.compute_capability,
                                known(g.sm_count, std::to_string(g.sm_count)),
                                sheet ? " (datasheet figures: not measured on this GPU yet)" : "");
  out += "- Shared memory: " + known(g.shared_bytes_per_block, Bytes(g.shared_bytes_per_block)) +
         " per block (opt-in maximum)";
  if (g.shared_bytes_per_sm) out += ", " + Bytes(g.shared_bytes_per_sm) + " per SM";
  out += "\n- L2 cache: " + known(g.l2_bytes, Bytes(g.l2_bytes)) + "\n";
  if (g.registers_per_sm) out += fmt::format("- Registers: {} per SM\n", g.registers_per_sm);
  out += std::string("- Memory bandwidth (") + (sheet ? "datasheet peak" : "measured") + "): " +
         known(g.memory_bandwidth_gbps > 0, fmt::format("{:.0f} GB/s", g.memory_bandwidth_gbps)) + "\n";
  std::vector<std::string> peaks;
  if (g.fp32_tflops) peaks.push_back(fmt::format("FP32 {:.1f}", g.fp32_tflops));
  if (g.tf32_tflops) peaks.push_back(fmt::format("TF32 tensor cores {:.0f}", g.tf32_tflops));
  if (g.fp16_tensor_tflops) peaks.push_back(fmt::format("FP16/BF16 tensor cores {:.0f}", g.fp16_tensor_tflops));
  if (peaks.empty()) return out + "- Compute peaks: unknown";
  out += sheet ? "- Dense matmul peaks (datasheet), TFLOP/s: " : "- Dense matmul peaks (measured, cuBLAS), TFLOP/s: ";
  for (size_t i = 0; i < peaks.size(); ++i) out += (i ? ", " : "") + peaks[i];
  return out;
}

std::string BankExamplesText(const std::vector<BankKernel>& bank) {
  if (bank.empty()) return "";
  std::string out =
      "\n\n## Kernels that worked for similar operators\n\n"
      "Measured, correct kernels from earlier searches on related problems (other shapes or a similar "
      "operator). They are examples, not answers: the shapes and the computation here may differ.\n";
  for (const auto& b : bank) {
    out += fmt::format("\n### {} (bank kernel {})", b.problem_name, b.candidate_id);
    std::vector<std::string> figures;
    if (b.speedup_eager) figures.push_back(fmt::format("{:.2f}x over eager", *b.speedup_eager));
    if (b.speedup_compile) figures.push_back(fmt::format("{:.2f}x over torch.compile", *b.speedup_compile));
    if (b.median_ms) figures.push_back(fmt::format("median {:.4f} ms", *b.median_ms));
    for (size_t i = 0; i < figures.size(); ++i) out += (i ? ", " : ": ") + figures[i];
    out += "\n\n```cuda\n" + Capped(b.source, kMaxLogChars) + "\n```\n\n```json\n" + b.plan_json + "\n```\n";
  }
  return out;
}

// What the floor rests on, in a few words: " (compute-bound: 137 GFLOP of
// fp32 matmul work at 165 TFLOP/s via 3xTF32; memory floor 0.0671 ms)".
std::string FloorBasis(const Roofline& r) {
  if (r.compute_floor_ms <= 0 && r.memory_floor_ms <= 0) return "";
  if (r.compute_floor_ms <= 0) return " (memory-bound: the bytes that must move over the measured bandwidth)";
  std::string path = r.fp32_path == "3xTF32" ? " via 3xTF32 on the tensor cores (float32-accurate)" : "";
  std::string s = fmt::format(" ({}-bound: {:.3g} GFLOP of {} matrix work at {:.0f} TFLOP/s{}; the {} floor is {:.4f} ms)",
                              r.bound, r.flops / 1e9, r.compute_class, r.peak_tflops, path,
                              r.bound == "compute" ? "memory" : "compute",
                              r.bound == "compute" ? r.memory_floor_ms : r.compute_floor_ms);
  return s;
}

std::string MeasurementsText(const ParentKernel& parent) {
  std::string out;
  if (!parent.evaluation) {
    if (parent.eager) out += "- PyTorch eager: " + Timing(*parent.eager) + "\n";
    if (parent.compiled) out += "- torch.compile: " + Timing(*parent.compiled) + "\n";
    return out.empty() ? "(no measurements yet)" : out;
  }
  const Evaluation& e = *parent.evaluation;
  out += std::string("- Status: ") + EvalStatusName(e.status) + (e.device.empty() ? "" : " on " + e.device) + "\n";
  if (e.specialised()) out += "- Inputs: " + e.robustness->Summary() + "\n";  // what to fix before speed
  if (e.timing) out += "- Time: " + Timing(*e.timing) + "\n";
  if (e.eager) out += "- PyTorch eager: " + Timing(*e.eager) + "\n";
  if (e.compiled) out += "- torch.compile: " + Timing(*e.compiled) + "\n";
  if (e.speedup_eager) out += fmt::format("- Speedup over eager: {:.2f}x\n", *e.speedup_eager);
  if (e.speedup_compile) out += fmt::format("- Speedup over torch.compile: {:.2f}x\n", *e.speedup_compile);
  if (e.roofline) {
    const Roofline& r = *e.roofline;
    out += fmt::format("- Roofline: {:.0f} GB/s", r.achieved_gbps);
    if (r.flops > 0) out += fmt::format(", {:.2f} TFLOP/s", r.achieved_tflops);
    out += fmt::format("; the floor is {:.4f} ms{}, so this runs at {:.0f}% of the achievable speed\n", r.floor_ms,
                       FloorBasis(r), 100 * r.fraction_of_floor);
  }
  // The digest, not the raw metrics: a few hundred characters per launch.
  // Without counters nothing is said: why is the user's business (eval, the
  // search's note), not the model's.
  if (e.counters && !e.counters->launches.empty())
    out += "- Hardware counters (Nsight Compute, one launch each; % of the GPU's peak):\n" +
           CountersText(*e.counters, "  - ", kMaxCountersChars);
  for (const auto& k : e.resources)
    out += fmt::format("- Kernel `{}`: {} registers/thread, {} static shared, {} B stack, spills {} B store / {} B load\n",
                       k.kernel, k.registers, Bytes(k.static_shared_bytes), k.stack_frame_bytes, k.spill_store_bytes,
                       k.spill_load_bytes);
  for (const auto& l : e.launches)
    out += fmt::format("- Launch `{}`: grid ({}, {}, {}), block ({}, {}, {}), {} dynamic shared\n", l.kernel, l.grid[0],
                       l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], Bytes(l.shared_bytes));
  if (!e.launch_profiles.empty()) {
    out += "- Each launch on its own (events between launches, in runs apart from the timed ones; bandwidth as "
           "if every buffer a launch is passed moved once; occupancy is the theoretical one from the driver):\n";
    out += LaunchProfileText(e.launch_profiles, "  - ");
  }
  return out;
}

std::string IndexInShape(const std::string& name, int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] <= 0) return fmt::format("{}[flat {}]", name, flat);
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::string out = name + "[";
  for (size_t d = 0; d < idx.size(); ++d) out += (d ? ", " : "") + std::to_string(idx[d]);
  return out + "]";
}

std::string FiguresLine(const Evaluation& e) {
  std::string out;
  if (e.timing) out += fmt::format("{:.4f} ms", e.timing->median_ms);
  if (e.specialised()) out += fmt::format(" (specialised: '{}' broke it)", e.robustness->broken_by);
  if (e.speedup_eager) out += fmt::format(", {:.2f}x eager", *e.speedup_eager);
  if (e.speedup_compile) out += fmt::format(", {:.2f}x torch.compile", *e.speedup_compile);
  if (e.roofline && e.roofline->floor_ms > 0)
    out += fmt::format(", {:.0f}% of the floor ({:.0f} GB/s)", 100 * e.roofline->fraction_of_floor,
                       e.roofline->achieved_gbps);
  if (!e.launch_profiles.empty()) {
    out += "; launches:";
    for (const auto& p : e.launch_profiles) {
      out += fmt::format(" `{}` {:.4f} ms", p.kernel, p.median_ms);
      if (p.occupancy)
        out += fmt::format(" ({} blocks/SM{})", p.occupancy->blocks_per_sm,
                           p.occupancy->limiter.empty() ? "" : ", " + p.occupancy->limiter + "-limited");
    }
  }
  return out;
}

std::string TopKernelsText(const std::vector<TopKernel>& best) {
  if (best.empty()) return "(no correct kernel yet)";
  std::string out;
  for (size_t i = 0; i < best.size(); ++i) {
    const TopKernel& k = best[i];
    // No row ids: they depend on thread timing, and a prompt must be the same
    // in every run of a search (replays and resumes depend on it).
    out += fmt::format("{}.{} {}\n", i + 1, k.is_parent ? " (the starting point below)" : "", FiguresLine(k.evaluation));
    out += "   idea: " + (k.idea.empty() ? std::string("(the seed kernel)") : Capped(k.idea, 800)) + "\n";
    for (const auto& l : k.evaluation.launches)
      out += fmt::format("   launch `{}`: grid ({}, {}, {}), block ({}, {}, {}), {} dynamic shared\n", l.kernel,
                         l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], Bytes(l.shared_bytes));
  }
  return out;
}

std::vector<TemplateRecord> HopperRecords(const GpuFacts& g) {
  int major = 0, minor = 0;
  if (std::sscanf(g.compute_capability.c_str(), "%d.%d", &major, &minor) != 2 || major < 9) return {};
  // The arch-specific target candidates compile for (evaluator/compile/compiler.h).
  return {{{"hopper_target", ArchSpecificTarget("sm_" + std::to_string(major) + std::to_string(minor))}}};
}

std::string LaunchLimitsText(const GpuFacts& g) {
  std::string out = "- Shared memory per block: ";
  out += g.shared_bytes_per_block > 0
             ? Bytes(g.shared_bytes_per_block) + " at most (static + dynamic, the opt-in limit; above 48 KiB the "
                                                 "evaluator opts in for you)"
             : std::string("unknown");
  out += g.shared_bytes_per_sm > 0 ? "; " + Bytes(g.shared_bytes_per_sm) + " per SM, shared by the blocks resident on it\n"
                                   : "; per SM: unknown\n";
  if (g.registers_per_sm <= 0) return out + "- Registers per thread at each block size: unknown";
  const int max_per_thread = g.max_registers_per_thread > 0 ? g.max_registers_per_thread : 255;
  out += fmt::format("- Registers: {} per SM, at most {} per thread (more spill to local memory). "
                     "The budget per thread at each block size (allocated per warp in units of 256):\n\n",
                     g.registers_per_sm, max_per_thread);
  out += "| threads per block | most registers/thread so one block fits | registers/thread for full occupancy |\n"
         "|---|---|---|\n";
  // Per thread, rounded down to the allocation unit (8 per thread = 256 per warp).
  auto budget = [&](int64_t threads_resident) {
    int64_t per_thread = g.registers_per_sm / threads_resident / 8 * 8;
    return std::min<int64_t>(per_thread, max_per_thread);
  };
  for (int threads : {64, 128, 256, 512, 1024}) {
    std::string full = "unknown";
    if (g.max_threads_per_sm > 0 && g.max_blocks_per_sm > 0) {
      int blocks = std::min(g.max_threads_per_sm / threads, g.max_blocks_per_sm);
      full = fmt::format("{} ({} blocks, {} threads per SM)", budget(int64_t{blocks} * threads), blocks,
                         blocks * threads);
    }
    out += fmt::format("| {} | {} | {} |\n", threads, budget(threads), full);
  }
  out += "\nCap a kernel's registers with `__launch_bounds__(threads, min_blocks_per_sm)`; the measurements "
         "below give each kernel's registers and its occupancy.";
  return out;
}

std::string FailureDetails(const Evaluation& e, const Signature* sig) {
  std::string out = e.message.empty() ? "" : e.message + "\n";
  switch (e.status) {
    case EvalStatus::kCompileError:
      out += "\nCompiler log:\n```\n" + Capped(e.compile_log, kMaxLogChars) + "\n```";
      break;
    case EvalStatus::kIncorrect:
      for (const auto& o : e.errors) {
        out += fmt::format(
            "- Output `{}` (input set {}): max abs error {:.3g}, max rel error {:.3g}, relative norm {:.3g}; "
            "{} elements outside tolerance (first at flat index {}), {} never written, {} NaN/Inf where the "
            "reference is finite\n",
            o.name, o.input_set, o.max_abs, o.max_rel, o.rel_norm, o.mismatches, o.first_mismatch, o.unwritten,
            o.nan_mismatches);
        if (const TensorSpec* t = sig ? sig->Find(o.name) : nullptr; t && o.first_mismatch >= 0 && !t->is_scalar) {
          out.pop_back();  // the line's newline: the position belongs to it
          out += fmt::format("; the first wrong element is {} of shape {}, in input set {}\n",
                             IndexInShape(o.name, o.first_mismatch, t->shape), Shape(t->shape), o.input_set);
        }
      }
      break;
    case EvalStatus::kCorrect:
      out += "(the candidate is correct)";
      break;
    default:
      if (!e.worker_log.empty()) out += "\nWorker log:\n```\n" + Capped(e.worker_log, kMaxLogChars) + "\n```";
      break;
  }
  return out.empty() ? std::string("(no details)") : out;
}

StatusOr<RenderedPrompt> RenderIdeasPrompt(const PromptLibrary& lib, const IdeasPromptInputs& in) {
  TemplateVars v = ProblemVars(in.problem);
  SetParentVars(in.parent, &v);
  std::vector<TemplateRecord> tried;
  for (const auto& t : in.tried) tried.push_back({{"idea", t.idea}, {"outcome", t.outcome}});
  v.SetList("tried_ideas", std::move(tried));
  v.Set("best_kernels", TopKernelsText(in.best));
  v.Set("num_ideas", std::to_string(in.num_ideas));
  v.Set("bank_examples", BankExamplesText(in.bank));
  return Render(lib, "ideas", v);
}

StatusOr<RenderedPrompt> RenderImplementPrompt(const PromptLibrary& lib, const ImplementPromptInputs& in) {
  TemplateVars v = ProblemVars(in.problem);
  SetParentVars(in.parent, &v);
  v.Set("idea", in.idea);
  v.Set("bank_examples", in.parent.candidate ? std::string() : BankExamplesText(in.bank));
  return Render(lib, "implement", v);
}

StatusOr<RenderedPrompt> RenderRepairPrompt(const PromptLibrary& lib, const RepairPromptInputs& in) {
  TemplateVars v = ProblemVars(in.problem);
  v.Set("idea", in.idea);
  v.Set("candidate_source", in.candidate.source);
  v.Set("candidate_plan", in.candidate.plan_json);
  v.Set("failure_status", EvalStatusName(in.evaluation.status));
  v.Set("failure_details", FailureDetails(in.evaluation, &in.problem.signature));
  return Render(lib, "repair", v);
}

}  // namespace ks
