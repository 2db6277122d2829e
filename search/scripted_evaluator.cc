#include "search/scripted_evaluator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/json_field.h"
#include "evaluator/plan/launch_plan.h"
#include "search/search_config.h"
#include "store/candidate_hash.h"

namespace ks {
namespace {

// The text inside MARKER( ... ), or "" when absent.
std::string MarkerArg(const std::string& source, const std::string& marker) {
  size_t at = source.find(marker + "(");
  if (at == std::string::npos) return "";
  size_t begin = at + marker.size() + 1;
  size_t end = source.find(')', begin);
  if (end == std::string::npos) return "";
  return source.substr(begin, end - begin);
}

std::vector<double> NumberList(const std::string& text) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    out.push_back(std::strtod(text.substr(pos, comma - pos).c_str(), nullptr));
    pos = comma + 1;
  }
  return out;
}

// What an H100 SXM's SM offers (cuDeviceGetAttribute there), so scripted
// occupancy figures are ones a real run could show.
constexpr SmLimits kH100Sm{65536, 65536, 233472, 1024, 2048, 32};

// Per-launch figures as the GPU evaluator would report them: the launches'
// names, block sizes and shared memory from the plan, times and registers from
// the markers.
std::vector<LaunchProfile> ScriptedProfiles(const Candidate& c, const std::vector<double>& launch_ms) {
  if (!CheckPlanText(c.plan_json).ok()) return {};
  nlohmann::json plan = nlohmann::json::parse(c.plan_json, nullptr, false);
  if (!plan.is_object() || !plan.contains("launches") || !plan["launches"].is_array()) return {};
  std::vector<double> regs = NumberList(MarkerArg(c.source, "FAKE_REGISTERS"));
  std::vector<std::string> kernels;
  std::vector<std::vector<double>> ms;
  std::vector<std::optional<Occupancy>> occ;
  const auto& ls = plan["launches"];
  for (size_t i = 0; i < ls.size() && i < launch_ms.size(); ++i) {
    kernels.push_back(ls[i].value("kernel", "?"));
    ms.push_back({launch_ms[i]});
    if (i >= regs.size()) {
      occ.push_back(std::nullopt);
      continue;
    }
    Occupancy o;
    o.threads_per_block = 1;
    if (ls[i].contains("block") && ls[i]["block"].is_array())
      for (const auto& d : ls[i]["block"]) o.threads_per_block *= d.is_number_integer() ? d.get<int>() : 1;
    o.registers = static_cast<int>(regs[i]);
    if (ls[i].contains("shared_bytes") && ls[i]["shared_bytes"].is_number_integer())
      o.shared_bytes = ls[i]["shared_bytes"].get<int64_t>();
    ExplainOccupancy(kH100Sm, &o);
    // The driver's answer without a carve-out: the smallest bound.
    int blocks = 1 << 30;
    for (int b : {o.by_registers, o.by_shared, o.by_threads, o.by_block_limit})
      if (b >= 0) blocks = std::min(blocks, b);
    o.blocks_per_sm = blocks;
    ExplainOccupancy(kH100Sm, &o);  // again, for the warps fraction of those blocks
    occ.push_back(o);
  }
  return BuildLaunchProfiles(kernels, ms, std::vector<double>(kernels.size(), 0), 0, 0, 0, occ);
}

}  // namespace

StatusOr<ScriptedEvaluatorOptions> LoadScriptedEvaluatorOptions(const std::string& path) {
  KS_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return InvalidArgument(path + ": fake evaluator config must be a JSON object");
  ScriptedEvaluatorOptions o;
  try {
    ReadField(j, "eager_ms", &o.eager_ms);
    ReadField(j, "compile_ms", &o.compile_ms);
    ReadField(j, "delay_ms", &o.delay_ms);
    ReadField(j, "floor_ms", &o.floor_ms);
    ReadField(j, "log", &o.log_path);
    ReadField(j, "fail_after", &o.fail_after);
    ReadField(j, "device", &o.device);
    ReadField(j, "check_reference", &o.check_reference);
    if (j.contains("counters")) {
      if (!j["counters"].is_object()) return InvalidArgument(path + ": \"counters\" must be an object");
      o.counters = CounterReportFromJson(j["counters"]);
    }
    if (j.contains("gpu")) {
      if (!j["gpu"].is_object()) return InvalidArgument(path + ": \"gpu\" must be an object");
      o.gpu = GpuFactsFromJson(j["gpu"]);
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path + ": " + e.what());
  }
  return o;
}

Evaluation ScriptedEvaluator::Decide(const Candidate& c) const {
  Evaluation e;
  e.device = options_.device;
  std::string status = MarkerArg(c.source, "FAKE_STATUS");
  if (status.empty()) status = "correct";
  auto parsed = ParseEvalStatus(status);
  e.status = parsed.ok() ? *parsed : EvalStatus::kCompileError;
  if (e.status != EvalStatus::kCorrect) {
    e.message = "scripted " + status;
    if (e.status == EvalStatus::kCompileError) e.compile_log = "fake.cu(1): error: scripted failure";
    return e;
  }
  double ms = 1.0;
  std::string ms_text = MarkerArg(c.source, "FAKE_MS");
  if (!ms_text.empty()) ms = std::strtod(ms_text.c_str(), nullptr);
  if (!(ms > 0)) ms = 1.0;
  e.timing = TimingStats{ms, ms, ms, ms, 0, 20, "runs"};
  e.eager = TimingStats{options_.eager_ms, options_.eager_ms, options_.eager_ms, options_.eager_ms, 0, 20, ""};
  e.compiled = TimingStats{options_.compile_ms, options_.compile_ms, options_.compile_ms, options_.compile_ms, 0, 20, ""};
  e.speedup_eager = options_.eager_ms / ms;
  e.speedup_compile = options_.compile_ms / ms;
  if (std::string launch_ms = MarkerArg(c.source, "FAKE_LAUNCH_MS"); !launch_ms.empty())
    e.launch_profiles = ScriptedProfiles(c, NumberList(launch_ms));
  if (options_.floor_ms > 0) {
    Roofline r;
    r.floor_ms = options_.floor_ms;
    r.fraction_of_floor = options_.floor_ms / ms;
    e.roofline = r;
  }
  return e;
}

StatusOr<std::vector<Evaluation>> ScriptedEvaluator::EvaluateBatch(const std::vector<Candidate>& candidates) {
  batches_++;
  std::vector<Evaluation> out;
  out.reserve(candidates.size());
  for (const Candidate& c : candidates) {
    if (options_.fail_after >= 0 && evaluated_.load() >= options_.fail_after)
      return Unavailable("fake evaluator: scripted failure after " + std::to_string(options_.fail_after) +
                         " candidates");
    if (options_.delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(options_.delay_ms * 1000)));
    out.push_back(Decide(c));
    evaluated_++;
    std::lock_guard<std::mutex> lock(mu_);
    sources_.push_back(c.source);
    if (!options_.log_path.empty()) {
      std::FILE* f = std::fopen(options_.log_path.c_str(), "a");
      if (!f) return PosixError(options_.log_path, errno);
      std::fprintf(f, "%s\n", store::CandidateContentHash(c.source, c.plan_json).c_str());
      std::fclose(f);
    }
  }
  return out;
}

std::vector<std::string> ScriptedEvaluator::sources() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sources_;
}

}  // namespace ks
