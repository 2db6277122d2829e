#include "evaluator/evaluation.h"

#include "common/json_field.h"

namespace ks {

namespace {
constexpr std::pair<EvalStatus, const char*> kNames[] = {
    {EvalStatus::kCompileError, "compile_error"}, {EvalStatus::kInvalidPlan, "invalid_plan"},
    {EvalStatus::kLaunchError, "launch_error"},   {EvalStatus::kRuntimeError, "runtime_error"},
    {EvalStatus::kTimeout, "timeout"},            {EvalStatus::kIncorrect, "incorrect"},
    {EvalStatus::kCorrect, "correct"},
};
using json = nlohmann::json;

template <typename T>
json Opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}
}  // namespace

const char* EvalStatusName(EvalStatus s) {
  for (auto [v, n] : kNames)
    if (v == s) return n;
  return "?";
}

StatusOr<EvalStatus> ParseEvalStatus(const std::string& s) {
  for (auto [v, n] : kNames)
    if (s == n) return v;
  return InvalidArgument("unknown evaluation status '" + s + "'");
}

json TimingToJson(const TimingStats& t) {
  json j{{"median_ms", t.median_ms}, {"mean_ms", t.mean_ms}, {"min_ms", t.min_ms},
         {"max_ms", t.max_ms},       {"stddev_ms", t.stddev_ms}, {"runs", t.runs}};
  if (!t.stopped.empty()) {
    j["stopped"] = t.stopped;
    j["cut_short"] = t.cut_short();
  }
  return j;
}

TimingStats TimingFromJson(const json& j) {
  TimingStats t;
  t.median_ms = j.value("median_ms", 0.0);
  t.mean_ms = j.value("mean_ms", 0.0);
  t.min_ms = j.value("min_ms", 0.0);
  t.max_ms = j.value("max_ms", 0.0);
  t.stddev_ms = j.value("stddev_ms", 0.0);
  t.runs = j.value("runs", 0);
  t.stopped = j.value("stopped", "");
  return t;
}

json EvaluationToJson(const Evaluation& e) {
  json j{{"status", EvalStatusName(e.status)}, {"message", e.message},  {"compile_log", e.compile_log},
         {"worker_log", e.worker_log},         {"device", e.device},    {"target", e.target},
         {"compile_s", e.compile_s},
         {"eval_s", e.eval_s}};
  j["resources"] = json::array();
  for (const auto& r : e.resources)
    j["resources"].push_back({{"kernel", r.kernel}, {"registers", r.registers},
                              {"static_shared_bytes", r.static_shared_bytes}, {"stack_frame_bytes", r.stack_frame_bytes},
                              {"spill_store_bytes", r.spill_store_bytes}, {"spill_load_bytes", r.spill_load_bytes}});
  j["launches"] = json::array();
  for (const auto& l : e.launches)
    j["launches"].push_back({{"kernel", l.kernel},
                             {"grid", {l.grid[0], l.grid[1], l.grid[2]}},
                             {"block", {l.block[0], l.block[1], l.block[2]}},
                             {"shared_bytes", l.shared_bytes}});
  j["errors"] = json::array();
  for (const auto& o : e.errors)
    j["errors"].push_back({{"name", o.name}, {"max_abs", o.max_abs}, {"max_rel", o.max_rel}, {"rel_norm", o.rel_norm},
                           {"mismatches", o.mismatches}, {"first_mismatch", o.first_mismatch},
                           {"unwritten", o.unwritten}, {"nan_mismatches", o.nan_mismatches}, {"input_set", o.input_set},
                           {"rel_norm_bound", o.rel_norm_bound}, {"considered", o.considered},
                           {"large_errors", o.large_errors}, {"large_rel", o.large_rel},
                           {"large_share_cap", o.large_share_cap}});
  j["timing"] = e.timing ? TimingToJson(*e.timing) : json(nullptr);
  j["eager"] = e.eager ? TimingToJson(*e.eager) : json(nullptr);
  j["compiled"] = e.compiled ? TimingToJson(*e.compiled) : json(nullptr);
  j["speedup_eager"] = Opt(e.speedup_eager);
  j["speedup_compile"] = Opt(e.speedup_compile);
  if (e.speedup_best) j["speedup_best"] = *e.speedup_best;
  if (e.roofline) {
    const auto& r = *e.roofline;
    j["roofline"] = {{"bytes", r.bytes}, {"flops", r.flops}, {"achieved_gbps", r.achieved_gbps},
                     {"achieved_tflops", r.achieved_tflops}, {"floor_ms", r.floor_ms},
                     {"fraction_of_floor", r.fraction_of_floor}, {"peak_gbps", r.peak_gbps},
                     {"peak_tflops", r.peak_tflops}, {"compute_class", r.compute_class}, {"bound", r.bound},
                     {"flops_source", r.flops_source}, {"flops_note", r.flops_note},
                     {"memory_floor_ms", r.memory_floor_ms}, {"compute_floor_ms", r.compute_floor_ms},
                     {"fp32_path", r.fp32_path}, {"peak_fp32_tflops", r.peak_fp32_tflops},
                     {"peak_tf32_tflops", r.peak_tf32_tflops}};
  } else {
    j["roofline"] = nullptr;
  }
  j["launch_profiles"] = LaunchProfilesToJson(e.launch_profiles);
  if (e.counters) j["counters"] = CounterReportToJson(*e.counters);
  if (!e.phases.empty()) {
    json ph = json::object();
    for (const auto& [name, s] : e.phases) ph[name] = ph.value(name, 0.0) + s;
    j["phases_s"] = ph;
  }
  if (!e.run_parts.empty()) {
    json rp = json::object();
    for (const auto& [name, s] : e.run_parts) rp[name] = rp.value(name, 0.0) + s;
    j["run_parts_s"] = rp;
  }
  if (e.robustness) j["robustness"] = RobustnessToJson(*e.robustness);
  if (!e.precision.empty()) j["precision"] = e.precision;
  if (!e.baseline.empty()) j["baseline"] = e.baseline;
  if (e.eager_fp32) j["eager_fp32"] = TimingToJson(*e.eager_fp32);
  if (e.speedup_eager_fp32) j["speedup_eager_fp32"] = *e.speedup_eager_fp32;
  return j;
}

std::string Robustness::Summary() const {
  std::string held, not_checked;
  for (const auto& c : checks) {
    if (c.outcome == "held") held += (held.empty() ? "" : ", ") + c.check;
    if (c.outcome == "not_checked") not_checked += (not_checked.empty() ? "" : ", ") + c.check;
  }
  std::string out;
  if (specialised()) {
    out = "specialised: correct on the get_inputs() sets, but '" + broken_by + "' broke it";
    for (const auto& c : checks)
      if (c.check == broken_by && !c.detail.empty()) out += " (" + c.detail + ")";
  } else {
    out = "robust: held on " + (held.empty() ? std::string("nothing") : held);
  }
  if (!not_checked.empty()) out += "; not checked: " + not_checked;
  return out;
}

// RequireRobust's mark: what ApplyRobustPolicy undoes, and nothing else.
constexpr std::string_view kRobustRequired = " (robust kernels required: --require robust)";

void RequireRobust(Evaluation& e) {
  if (!e.correct() || !e.specialised()) return;
  e.status = EvalStatus::kIncorrect;
  e.message = e.robustness->Summary() + std::string(kRobustRequired);
}

void ApplyRobustPolicy(Evaluation& e, bool require_robust) {
  if (require_robust) return RequireRobust(e);
  if (e.status == EvalStatus::kIncorrect && e.specialised() && e.message.ends_with(kRobustRequired)) {
    e.status = EvalStatus::kCorrect;
    e.message.clear();
  }
}

json RobustnessToJson(const Robustness& r) {
  json checks = json::array();
  for (const auto& c : r.checks) checks.push_back({{"check", c.check}, {"outcome", c.outcome}, {"detail", c.detail}});
  return {{"specialised", r.specialised()}, {"broken_by", r.broken_by}, {"checks", checks}};
}

Robustness RobustnessFromJson(const json& j) {
  Robustness r;
  if (!j.is_object()) return r;
  r.broken_by = j.value("broken_by", "");
  for (const auto& c : j.value("checks", json::array()))
    if (c.is_object()) r.checks.push_back({c.value("check", ""), c.value("outcome", ""), c.value("detail", "")});
  return r;
}

StatusOr<Evaluation> EvaluationFromJson(const json& j) {
  if (!j.is_object() || !j.contains("status")) return InvalidArgument("evaluation JSON needs 'status'");
  Evaluation e;
  KS_ASSIGN_OR_RETURN(e.status, ParseEvalStatus(j["status"].get<std::string>()));
  e.message = j.value("message", "");
  e.compile_log = j.value("compile_log", "");
  e.worker_log = j.value("worker_log", "");
  e.device = j.value("device", "");
  e.target = j.value("target", "");
  e.compile_s = j.value("compile_s", 0.0);
  e.eval_s = j.value("eval_s", 0.0);
  for (const auto& r : j.value("resources", json::array()))
    e.resources.push_back({r.value("kernel", ""), r.value("registers", 0), r.value("static_shared_bytes", 0),
                           r.value("stack_frame_bytes", 0), r.value("spill_store_bytes", 0),
                           r.value("spill_load_bytes", 0)});
  for (const auto& l : j.value("launches", json::array())) {
    ResolvedLaunch rl;
    rl.kernel = l.value("kernel", "");
    for (int i = 0; i < 3; ++i) {
      rl.grid[i] = l["grid"][i].get<int64_t>();
      rl.block[i] = l["block"][i].get<int64_t>();
    }
    rl.shared_bytes = l.value("shared_bytes", int64_t{0});
    e.launches.push_back(rl);
  }
  for (const auto& o : j.value("errors", json::array())) {
    OutputError oe;
    oe.name = o.value("name", "");
    oe.max_abs = o.value("max_abs", 0.0);
    oe.max_rel = o.value("max_rel", 0.0);
    oe.rel_norm = o.value("rel_norm", 0.0);
    oe.mismatches = o.value("mismatches", int64_t{0});
    oe.first_mismatch = o.value("first_mismatch", int64_t{-1});
    oe.unwritten = o.value("unwritten", int64_t{0});
    oe.nan_mismatches = o.value("nan_mismatches", int64_t{0});
    oe.input_set = o.value("input_set", 0);
    oe.rel_norm_bound = o.value("rel_norm_bound", 0.0);
    oe.considered = o.value("considered", int64_t{0});
    oe.large_errors = o.value("large_errors", int64_t{0});
    oe.large_rel = o.value("large_rel", 0.0);
    oe.large_share_cap = o.value("large_share_cap", 0.0);
    e.errors.push_back(oe);
  }
  if (const json* f = FieldIf(j, "timing", &json::is_object)) e.timing = TimingFromJson(*f);
  if (const json* f = FieldIf(j, "eager", &json::is_object)) e.eager = TimingFromJson(*f);
  if (const json* f = FieldIf(j, "compiled", &json::is_object)) e.compiled = TimingFromJson(*f);
  if (const json* f = FieldIf(j, "speedup_eager", &json::is_number)) e.speedup_eager = f->get<double>();
  if (const json* f = FieldIf(j, "speedup_compile", &json::is_number)) e.speedup_compile = f->get<double>();
  if (const json* f = FieldIf(j, "speedup_best", &json::is_number)) e.speedup_best = f->get<double>();
  if (const json* f = FieldIf(j, "roofline", &json::is_object)) {
    const json& r = *f;
    Roofline& rf = e.roofline.emplace();
    rf.bytes = r.value("bytes", 0.0);
    rf.flops = r.value("flops", 0.0);
    rf.achieved_gbps = r.value("achieved_gbps", 0.0);
    rf.achieved_tflops = r.value("achieved_tflops", 0.0);
    rf.floor_ms = r.value("floor_ms", 0.0);
    rf.fraction_of_floor = r.value("fraction_of_floor", 0.0);
    rf.peak_gbps = r.value("peak_gbps", 0.0);
    rf.peak_tflops = r.value("peak_tflops", 0.0);
    rf.compute_class = r.value("compute_class", "");
    rf.bound = r.value("bound", "");
    rf.flops_source = r.value("flops_source", "");
    rf.flops_note = r.value("flops_note", "");
    rf.memory_floor_ms = r.value("memory_floor_ms", 0.0);
    rf.compute_floor_ms = r.value("compute_floor_ms", 0.0);
    rf.fp32_path = r.value("fp32_path", "");
    rf.peak_fp32_tflops = r.value("peak_fp32_tflops", 0.0);
    rf.peak_tf32_tflops = r.value("peak_tf32_tflops", 0.0);
  }
  e.launch_profiles = LaunchProfilesFromJson(j.value("launch_profiles", json::array()));
  if (const json* f = FieldIf(j, "counters", &json::is_object)) e.counters = CounterReportFromJson(*f);
  if (const json* f = FieldIf(j, "phases_s", &json::is_object))
    for (const auto& [name, v] : f->items())
      if (v.is_number()) e.phases.emplace_back(name, v.get<double>());
  if (const json* f = FieldIf(j, "run_parts_s", &json::is_object))
    for (const auto& [name, v] : f->items())
      if (v.is_number()) e.run_parts.emplace_back(name, v.get<double>());
  if (const json* f = FieldIf(j, "robustness", &json::is_object)) e.robustness = RobustnessFromJson(*f);
  e.precision = j.value("precision", "");
  e.baseline = j.value("baseline", "");
  if (const json* f = FieldIf(j, "eager_fp32", &json::is_object)) e.eager_fp32 = TimingFromJson(*f);
  if (const json* f = FieldIf(j, "speedup_eager_fp32", &json::is_number)) e.speedup_eager_fp32 = f->get<double>();
  return e;
}

}  // namespace ks
