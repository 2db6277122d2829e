#include "search/export.h"

#include <map>

#include <fmt/format.h>

#include "common/files.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/judge/judge.h"
#include "evaluator/problem.h"
#include "evaluator/signature.h"

namespace ks {
namespace {

// The exported module's Python files: export/ in the source tree,
// share/kernelsearch/export/ installed, found as the reference bridge is.
StatusOr<std::string> ReadExportFile(const std::string& name) {
  KS_ASSIGN_OR_RETURN(std::string path, FindDataFile("export/" + name));
  return ReadFile(path);
}

// A Python string literal (JSON strings are Python literals); bytes that are not
// UTF-8 become U+FFFD rather than an exception.
std::string PyString(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Text for the module's docstring: no quotes or backslashes that could end it.
std::string DocText(std::string s) {
  for (char& ch : s)
    if (ch == '"' || ch == '\\' || ch == '\n') ch = ' ';
  return s;
}

// The target the candidate was evaluated under (recorded with its evaluation
// since arch-specific targets exist), or `fallback` for older records.
std::string EvaluatedTarget(const store::CandidateRow& c, const std::string& fallback) {
  if (!c.evaluation) return fallback;
  nlohmann::json e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  std::string target = e.is_object() ? e.value("target", "") : "";
  return target.empty() ? fallback : target;
}

// The evaluation's robustness (Evaluation::robustness), JSON null when not recorded.
nlohmann::json StoredRobustness(const store::CandidateRow& c) {
  if (!c.evaluation) return nullptr;
  nlohmann::json e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  if (!e.is_object() || !e.contains("robustness") || !e["robustness"].is_object()) return nullptr;
  return e["robustness"];
}

std::string Describe(const store::CandidateRow& c) {
  if (!c.evaluation) return "not evaluated";
  nlohmann::json e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  std::string device = e.is_object() ? e.value("device", "") : "";
  std::string on = device.empty() ? "" : " on " + device;
  if (c.evaluation->status != EvalStatus::kCorrect)
    return std::string("NOT a correct kernel: evaluated ") + EvalStatusName(c.evaluation->status) + on;
  nlohmann::json robust = StoredRobustness(c);
  std::string limit;
  if (robust.is_object() && robust.value("specialised", false))
    limit = "; SPECIALISED: " + RobustnessFromJson(robust).Summary() + "; check() it on your own inputs";
  const std::string stored = e.is_object() ? e.value("precision", "") : "";
  if (auto contract = ParseContract(stored); contract.ok()) {
    limit += std::string("; precision contract ") + ContractName(*contract);
    switch (*contract) {
      case Contract::kHighest: break;
      case Contract::kHigh: limit += " (TF32-class error allowed), not exact fp32"; break;
      case Contract::kMedium: limit += " (bf16-class error allowed), not exact fp32"; break;
      case Contract::kKernelBench: limit += " (atol = rtol = 1e-2), not exact fp32"; break;
    }
  } else if (!stored.empty()) {
    limit += "; precision contract " + stored;
  }
  if (c.evaluation->speedup_eager)
    return fmt::format("correct, {:.2f}x over PyTorch eager{}{}", *c.evaluation->speedup_eager, on, limit);
  return "correct" + on + limit;
}

}  // namespace

const std::vector<std::string>& EvaluatorNvrtcOptions() { return NvrtcBaseOptions(); }

const char* EvaluatorNvrtcPrelude() { return NvrtcPrelude(); }

StatusOr<std::string> LaunchPlanPython() { return ReadExportFile("ks_launch_plan.py"); }

StatusOr<std::string> RenderModuleTemplate(const std::string& text, const std::map<std::string, std::string>& values) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t open = text.find("@@", pos);
    if (open == std::string::npos) break;
    size_t close = text.find("@@", open + 2);
    if (close == std::string::npos) return Internal("unterminated @@ in the module template");
    std::string key = text.substr(open + 2, close - open - 2);
    auto it = values.find(key);
    if (it == values.end()) return Internal("no value for @@" + key + "@@ in the module template");
    // "@@KEY@@": the quotes go with the placeholder, a string literal takes their place.
    bool quoted = open > 0 && text[open - 1] == '"' && close + 2 < text.size() && text[close + 2] == '"';
    size_t from = quoted ? open - 1 : open, to = quoted ? close + 3 : close + 2;
    out += text.substr(pos, from - pos);
    out += quoted ? PyString(it->second) : DocText(it->second);
    pos = to;
  }
  out += text.substr(pos);
  return out;
}

const char* ParamKindCode(ParamKind k) {
  switch (k) {
    case ParamKind::kB64: return "b64";
    case ParamKind::kB32: return "b32";
    case ParamKind::kF32: return "f32";
    case ParamKind::kF64: return "f64";
    case ParamKind::kB16: return "b16";
    case ParamKind::kB8: return "b8";
    case ParamKind::kBytes: return "bytes";
  }
  return "?";
}

nlohmann::json KernelParamKindsJson(const std::vector<KernelInfo>& kernels) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& k : kernels) {
    nlohmann::json kinds = nlohmann::json::array();
    // A by-value struct carries its size ("bytes128": a CUtensorMap), which
    // decides whether a tensor map may fill it.
    for (const auto& p : k.params)
      kinds.push_back(p.kind == ParamKind::kBytes ? "bytes" + std::to_string(p.size) : std::string(ParamKindCode(p.kind)));
    j[k.name] = kinds;
  }
  return j;
}

nlohmann::json ResolvedPlanToJson(const ResolvedPlan& plan) {
  nlohmann::json launches = nlohmann::json::array();
  for (const auto& l : plan.launches) {
    nlohmann::json args = nlohmann::json::array();
    for (const auto& a : l.args) {
      switch (a.kind) {
        case ArgValue::Kind::kTensor: args.push_back({{"kind", "tensor"}, {"name", a.name}}); break;
        case ArgValue::Kind::kScratch: args.push_back({{"kind", "scratch"}, {"name", a.name}}); break;
        case ArgValue::Kind::kInt32: args.push_back({{"kind", "i32"}, {"value", a.i}}); break;
        case ArgValue::Kind::kInt64: args.push_back({{"kind", "i64"}, {"value", a.i}}); break;
        case ArgValue::Kind::kFloat32: args.push_back({{"kind", "f32"}, {"value", a.f}}); break;
        case ArgValue::Kind::kFloat64: args.push_back({{"kind", "f64"}, {"value", a.f}}); break;
        case ArgValue::Kind::kTensorMap: args.push_back({{"kind", "tensor_map"}, {"name", a.name}}); break;
      }
    }
    launches.push_back({{"kernel", l.kernel},
                        {"grid", l.grid},
                        {"block", l.block},
                        {"shared", l.shared_bytes},
                        {"cluster", l.cluster ? nlohmann::json(*l.cluster) : nlohmann::json(nullptr)},
                        {"args", args}});
  }
  nlohmann::json scratch = nlohmann::json::array();
  for (const auto& s : plan.scratch) scratch.push_back({{"name", s.name}, {"bytes", s.bytes}});
  nlohmann::json out = {{"launches", launches}, {"scratch", scratch}};
  // Only when there are maps, so plans without them resolve as they always did.
  if (!plan.tensor_maps.empty()) {
    out["tensor_maps"] = nlohmann::json::array();
    for (const auto& m : plan.tensor_maps) out["tensor_maps"].push_back(TensorMapToJson(m));
  }
  return out;
}

// The judging rule this kernel was held to (evaluator/judge/judge.h), for
// the module's check(): its contract and the judge's constants.
nlohmann::json JudgeJson(const store::CandidateRow& c) {
  std::string stored;
  if (c.evaluation) {
    auto e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
    if (e.is_object()) stored = e.value("precision", std::string());
  }
  auto parsed = ParseContract(stored.empty() ? "highest" : stored);
  const Contract contract = parsed.ok() ? *parsed : Contract::kHighest;
  return {{"contract", ContractName(contract)},
          {"factor", ContractFactor(contract)},
          {"highest_factor", kHighestFactor},
          {"bound_block", kBoundBlock},
          {"kernelbench_atol", kKernelBenchAtol},
          {"kernelbench_rtol", kKernelBenchRtol}};
}

StatusOr<std::vector<ExportedFile>> ExportCandidate(store::LineageStore* store, int64_t candidate_id,
                                                    const ExportOptions& options) {
  KS_ASSIGN_OR_RETURN(store::CandidateRow c, store->GetCandidate(candidate_id));
  const std::string which = "candidate " + std::to_string(c.id);
  if (c.source.empty()) return FailedPrecondition(which + " has no kernel source (the model's reply held none)");
  const nlohmann::json robustness = StoredRobustness(c);
  if (!options.allow_specialised && robustness.is_object() && robustness.value("specialised", false))
    return FailedPrecondition(which + " is " + RobustnessFromJson(robustness).Summary() +
                              ". It may give wrong answers for your model's inputs; export it anyway with "
                              "--allow-specialised (the module's check() verifies it on your data)");
  KS_ASSIGN_OR_RETURN(store::SearchRow search, store->GetSearch(c.search_id));
  KS_ASSIGN_OR_RETURN(store::ProblemRow problem, store->GetProblem(search.problem_id));
  nlohmann::json sj = nlohmann::json::parse(problem.signature_json, nullptr, false);
  if (!sj.is_object() || sj.empty())
    return FailedPrecondition("the store has no signature for problem " + problem.name);
  auto sig = SignatureFromJson(sj);
  if (!sig.ok()) return sig.status().WithContext("problem " + problem.name + " signature");

  // The parameter kinds come from the PTX of this very source (no GPU needed).
  // Compiled for the target it was evaluated under: a kernel that uses wgmma
  // compiles only for the arch-specific one (sm_90a).
  const std::string target = EvaluatedTarget(c, options.arch);
  CompileOptions co;
  co.arch = target;
  co.worker_path = options.worker_path;
  co.cuda_home = options.cuda_home;
  KS_ASSIGN_OR_RETURN(CompileResult compiled, CompileCandidate(c.source, co));
  if (!compiled.ok)
    return FailedPrecondition(which + " does not compile for " + target + ": " + compiled.message +
                              (compiled.log.empty() ? "" : "\n" + compiled.log));
  auto plan = ResolvePlan(c.plan_json, *sig, compiled.kernels, PlanLimits{});
  if (!plan.ok()) return FailedPrecondition(which + ": its launch plan does not resolve: " + plan.status().message());
  KS_ASSIGN_OR_RETURN(std::string cuda_home, FindCudaHome(options.cuda_home));

  KS_ASSIGN_OR_RETURN(std::string launch_plan_py, LaunchPlanPython());
  KS_ASSIGN_OR_RETURN(std::string module_template, ReadExportFile("kernel_module.py"));
  KS_ASSIGN_OR_RETURN(std::string module,
                      RenderModuleTemplate(module_template,
                                           {{"ID", std::to_string(c.id)},
                                            {"PROBLEM", problem.name},
                                            {"SPEEDUP", Describe(c)},
                                            {"SOURCE", c.source},
                                            {"PLAN", c.plan_json},
                                            {"SIGNATURE", SignatureToJson(*sig).dump()},
                                            {"KERNELS", KernelParamKindsJson(compiled.kernels).dump()},
                                            {"RESOLVED", ResolvedPlanToJson(*plan).dump()},
                                            {"NVRTC_OPTIONS", nlohmann::json(EvaluatorNvrtcOptions()).dump()},
                                            {"PRELUDE_NAME", kNvrtcPreludeName},
                                            {"PRELUDE", NvrtcPrelude()},
                                            {"CUDA_HOME", cuda_home},
                                            {"TARGET", target},
                                            {"ROBUSTNESS", robustness.dump()},
                                            {"JUDGE", JudgeJson(c).dump()}}));
  return std::vector<ExportedFile>{{"kernel.cu", c.source},
                                   {"plan.json", c.plan_json},
                                   {"problem.py", problem.source},
                                   {"ks_launch_plan.py", launch_plan_py},
                                   {"kernel_module.py", module}};
}

}  // namespace ks
