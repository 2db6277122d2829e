// kernelsearch compile PROBLEM CANDIDATE [--plan P] [--arch sm_90|sm_90a] [--json]
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "evaluator/compile/candidate_parser.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/plan/launch_plan.h"
#include "evaluator/problem.h"

namespace ks::cli {
namespace {

struct CompileArgs {
  std::string problem, candidate, plan, arch, python;
  bool json = false;
  double timeout_s = 60;
};

void PrintResources(const std::vector<KernelInfo>& kernels) {
  std::printf("%-28s %9s %12s %12s %13s\n", "kernel", "registers", "static smem", "stack frame", "spill st/ld");
  for (const auto& k : kernels)
    std::printf("%-28s %9d %12d %12d %6d/%-6d\n", k.name.c_str(), k.resources.registers,
                k.resources.static_shared_bytes, k.resources.stack_frame_bytes, k.resources.spill_store_bytes,
                k.resources.spill_load_bytes);
}

int Run(const CompileArgs& a) {
  auto cand = LoadCandidateFiles(a.candidate, a.plan);
  if (!cand.ok()) return ReportError(cand.status());
  BridgeOptions bo;
  bo.python = a.python;
  auto sig = LoadProblemSignature(a.problem, bo);
  if (!sig.ok()) return ReportError(sig.status());
  std::string arch = a.arch;
  PlanLimits limits;
  if (arch.empty()) {
    auto detected = DetectArch();
    arch = ArchSpecificTarget(detected.ok() ? *detected : "sm_90");
  }
  CompileOptions co;
  co.arch = arch;
  co.timeout_s = a.timeout_s;
  auto r = CompileCandidate(cand->source, co);
  if (!r.ok()) return ReportError(r.status());
  EvalStatus status = EvalStatus::kCorrect;
  std::string message;
  std::optional<ResolvedPlan> plan;
  if (!r->ok) {
    status = EvalStatus::kCompileError;
    message = r->message;
  } else {
    auto p = ResolvePlan(cand->plan_json, *sig, r->kernels, limits);
    if (!p.ok()) {
      status = EvalStatus::kInvalidPlan;
      message = p.status().message();
    } else {
      plan = *p;
    }
  }
  const char* verdict = status == EvalStatus::kCorrect ? "ok" : EvalStatusName(status);
  if (a.json) {
    nlohmann::json j{{"status", verdict}, {"message", message}, {"arch", arch}, {"log", r->log},
                     {"compile_s", r->seconds}};
    j["resources"] = nlohmann::json::array();
    for (const auto& k : r->kernels)
      j["resources"].push_back({{"kernel", k.name}, {"registers", k.resources.registers},
                                {"static_shared_bytes", k.resources.static_shared_bytes},
                                {"stack_frame_bytes", k.resources.stack_frame_bytes},
                                {"spill_store_bytes", k.resources.spill_store_bytes},
                                {"spill_load_bytes", k.resources.spill_load_bytes}});
    j["launches"] = nlohmann::json::array();
    if (plan)
      for (const auto& l : plan->launches)
        j["launches"].push_back({{"kernel", l.kernel}, {"grid", l.grid}, {"block", l.block}, {"shared_bytes", l.shared_bytes}});
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("status: %s (%s, %.2f s)\n", verdict, arch.c_str(), r->seconds);
    if (!message.empty()) std::printf("message: %s\n", message.c_str());
    if (!r->kernels.empty()) {
      std::printf("\n");
      PrintResources(r->kernels);
    }
    if (plan) {
      std::printf("\n%-28s %-22s %-16s %s\n", "launch", "grid", "block", "dynamic smem");
      for (const auto& l : plan->launches)
        std::printf("%-28s %-22s %-16s %lld\n", l.kernel.c_str(),
                    fmt::format("({}, {}, {})", l.grid[0], l.grid[1], l.grid[2]).c_str(),
                    fmt::format("({}, {}, {})", l.block[0], l.block[1], l.block[2]).c_str(),
                    static_cast<long long>(l.shared_bytes));
      for (const auto& s : plan->scratch)
        std::printf("scratch %-20s %lld bytes\n", s.name.c_str(), static_cast<long long>(s.bytes));
    }
    if (!r->log.empty()) std::printf("\ncompiler log:\n%s\n", r->log.c_str());
  }
  return status == EvalStatus::kCorrect ? kExitOk : kExitFailed;
}

}  // namespace

void RegisterCompileCommand(CLI::App& app) {
  auto a = std::make_shared<CompileArgs>();
  CLI::App* sub = app.add_subcommand(
      "compile", "Compile a candidate with NVRTC and check its launch plan against the problem (no GPU needed)");
  sub->add_option("problem", a->problem, "Problem file (KernelBench format .py)")->required()->check(CLI::ExistingFile);
  sub->add_option("candidate", a->candidate,
                  "Candidate: a .cu file (plan in --plan or next to it as .json) or a .md with ```cuda and ```json blocks")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--plan", a->plan, "Launch-plan JSON file")->check(CLI::ExistingFile);
  sub->add_option("--arch", a->arch, "NVRTC target: sm_90 or the arch-specific sm_90a (wgmma, setmaxnreg); default: the GPU's "
                  "arch-specific target, else sm_90a");
  sub->add_option("--timeout", a->timeout_s, "Compile time limit in seconds")->capture_default_str();
  AddPythonOption(sub, &a->python);
  sub->add_flag("--json", a->json, "Print JSON");
  sub->footer("Exit status: 0 compiled and the plan is valid, 1 compile error or invalid plan, 2 bad input.");
  SetAction(sub, [a] { return Run(*a); });
}

}  // namespace ks::cli
