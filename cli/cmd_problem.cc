// `kernelsearch problem info|check`: what a problem file declares, and whether
// its reference outputs are good enough to judge kernels by.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "evaluator/problem.h"

namespace ks::cli {
namespace {

struct ProblemArgs {
  std::string file;
  std::string python;
  double timeout_s = 600;
  bool json = false;
  bool verbose = false;
  // check only
  std::string device = "auto";
  uint64_t seed = 42;
};

void AddCommonOptions(CLI::App* sub, ProblemArgs* a) {
  sub->add_option("file", a->file, "problem file (KernelBench format: Model, get_inputs, get_init_inputs)")
      ->required();
  AddPythonOption(sub, &a->python);
  sub->add_option("--timeout", a->timeout_s, "seconds the reference bridge may run")->capture_default_str();
  sub->add_flag("--json", a->json, "print JSON instead of a table");
  sub->add_flag("-v,--verbose", a->verbose, "include the problem's traceback in error messages");
}

BridgeOptions ToBridge(const ProblemArgs& a) {
  BridgeOptions o;
  o.python = a.python;
  o.timeout_s = a.timeout_s;
  o.verbose = a.verbose;
  return o;
}

std::string ShapeText(const TensorSpec& t) {
  if (t.is_scalar) return fmt::format("scalar = {}", t.scalar_value);
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

std::string BytesText(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

void PrintSignature(const Signature& s) {
  std::printf("problem      %s\n", s.name.c_str());
  std::printf("file         %s\n", s.file.c_str());
  if (!s.description.empty()) std::printf("description  %s\n", s.description.c_str());
  if (s.tolerance) {
    std::printf("tolerance    atol %g, rtol %g (set by the problem)\n", s.tolerance->atol, s.tolerance->rtol);
  } else {
    std::string per;
    for (const auto& o : s.outputs) {
      Tolerance t = s.ToleranceFor(o.dtype);
      per += fmt::format("{}{}: atol {:g}, rtol {:g}", per.empty() ? "" : "; ", o.name, t.atol, t.rtol);
    }
    std::printf("tolerance    per-dtype defaults (%s)\n", per.c_str());
  }
  if (s.flops) std::printf("flops        %.6g\n", *s.flops);
  std::printf("min bytes    %s (every input and parameter read once, every output written once)\n\n",
              BytesText(static_cast<double>(s.MinimumBytes())).c_str());

  size_t name_w = 4;
  for (const auto* list : {&s.inputs, &s.parameters, &s.outputs})
    for (const auto& t : *list) name_w = std::max(name_w, t.name.size());
  auto row = [&](const char* kind, const std::string& name, const std::string& dtype, const std::string& shape) {
    std::printf("%-10s %-*s  %-9s %s\n", kind, static_cast<int>(name_w), name.c_str(), dtype.c_str(), shape.c_str());
  };
  row("kind", "name", "dtype", "shape");
  for (const auto& t : s.inputs) row("input", t.name, DTypeName(t.dtype), ShapeText(t));
  for (const auto& t : s.parameters) row("parameter", t.name, DTypeName(t.dtype), ShapeText(t));
  for (const auto& t : s.outputs) row("output", t.name, DTypeName(t.dtype), ShapeText(t));
}

int RunInfo(const ProblemArgs& a) {
  auto sig = LoadProblemSignature(a.file, ToBridge(a));
  if (!sig.ok()) return ReportError(sig.status());
  if (a.json) {
    std::printf("%s\n", SignatureToJson(*sig).dump(2).c_str());
  } else {
    PrintSignature(*sig);
  }
  return kExitOk;
}

int RunCheck(const ProblemArgs& a) {
  std::vector<std::string> notes;
  auto warnings = CheckProblem(a.file, ToBridge(a), a.device, a.seed, &notes);
  if (!warnings.ok()) return ReportError(warnings.status());
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"file", a.file}, {"warnings", *warnings}, {"notes", notes}}.dump(2).c_str());
  } else {
    if (warnings->empty()) std::printf("%s: ok: no degenerate reference outputs\n", a.file.c_str());
    for (const auto& w : *warnings) std::printf("%s: warning: %s\n", a.file.c_str(), w.c_str());
    // Near-degenerate: judged fairly only through the norm rules; not a refusal.
    for (const auto& n : notes) std::printf("%s: note: %s\n", a.file.c_str(), n.c_str());
  }
  // Degenerate outputs make every correctness verdict on this problem suspect.
  return warnings->empty() ? kExitOk : kExitFailed;
}

}  // namespace

void RegisterProblemCommands(CLI::App& app) {
  CLI::App* problem = app.add_subcommand("problem", "inspect and validate problem files");
  problem->require_subcommand(1);

  auto info_args = std::make_shared<ProblemArgs>();
  CLI::App* info = problem->add_subcommand(
      "info", "print a problem's signature: inputs, parameters and outputs with dtype and shape, "
              "tolerance, FLOPS and description");
  AddCommonOptions(info, info_args.get());
  SetAction(info, [info_args] { return RunInfo(*info_args); });

  auto check_args = std::make_shared<ProblemArgs>();
  CLI::App* check = problem->add_subcommand(
      "check", "run the reference on two input sets and warn about outputs that would let a wrong kernel "
               "pass (all zeros, constant, independent of the inputs, NaN/Inf); exit status 1 when any");
  AddCommonOptions(check, check_args.get());
  check->add_option("--device", check_args->device, "where the reference runs")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  check->add_option("--seed", check_args->seed, "model seed; input set i uses seed + 1 + i")->capture_default_str();
  SetAction(check, [check_args] { return RunCheck(*check_args); });
}

}  // namespace ks::cli
