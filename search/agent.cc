#include "search/agent.h"

#include <map>
#include <utility>

#include <fmt/format.h>

#include "evaluator/plan/launch_plan.h"
#include "search/prompts.h"
#include "search/slot_key.h"

namespace ks {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxLogChars = 6000;

std::string Capped(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n) + "\n[... " + std::to_string(s.size() - n) + " more characters]";
}

json CandidateSchema(const std::string& source, const std::string& plan) {
  return {{"type", "object"},
          {"properties",
           {{"source", {{"type", "string"}, {"description", source}}},
            {"plan", {{"type", "object"}, {"description", plan}}}}},
          {"required", {"source", "plan"}}};
}

bool Offered(const AgentTask& task, const std::string& name) {
  return name == "compile" || name == "test" || name == "submit" || (task.profile && name == "profile");
}

std::string OfferedList(const AgentTask& task) {
  return task.profile ? "compile, test, profile and submit" : "compile, test and submit";
}

// The candidate a call carries, or why it carries none (answered as a tool error).
StatusOr<Candidate> CandidateOf(const ToolCall& call) {
  if (!call.arguments_error.empty())
    return InvalidArgument(call.arguments_error + "; send an object {\"source\": \"...\", \"plan\": {...}}");
  const json& a = call.arguments;
  if (!a.contains("source") || !a["source"].is_string() || a["source"].get<std::string>().empty())
    return InvalidArgument("missing \"source\": the CUDA-C source, as a string");
  if (!a.contains("plan")) return InvalidArgument("missing \"plan\": the launch plan, a JSON object");
  Candidate c{a["source"].get<std::string>(), ""};
  if (a["plan"].is_object()) {
    KS_RETURN_IF_ERROR(CheckPlanValue(a["plan"]));  // dump() recurses: the plan limits first
    c.plan_json = a["plan"].dump(2);
  } else if (a["plan"].is_string() && (!CheckPlanText(a["plan"].get<std::string>()).ok() ||
                                       json::parse(a["plan"].get<std::string>(), nullptr, false).is_object())) {
    c.plan_json = a["plan"].get<std::string>();  // a plan sent as JSON text is taken as it is
  } else {
    return InvalidArgument("\"plan\" is not a JSON object (the launch plan)");
  }
  return c;
}

// Runs one tool call; a malformed call becomes a tool error, only the
// evaluator or the store failing is a Status.
StatusOr<store::AttemptRow> Execute(const AgentTask& task, const ToolCall& call, int turn, int index,
                                    AgentHost* host) {
  store::AttemptRow row;
  row.search_id = task.search_id;
  row.idea_id = task.idea_id;
  row.slot_key = task.slot;
  row.turn = turn;
  row.call_index = index;
  row.tool_call_id = call.id;
  row.tool = call.name;
  row.arguments = call.arguments.is_string() ? call.arguments.get<std::string>() : call.arguments.dump();
  auto tool_error = [&row](const std::string& why) {
    row.is_error = true;
    row.status = "tool_error";
    row.result = "error: " + why;
    return row;
  };
  if (!Offered(task, call.name))
    return tool_error("unknown tool '" + call.name + "'; the tools are " + OfferedList(task));
  StatusOr<Candidate> c = CandidateOf(call);
  if (!c.ok()) return tool_error(c.status().message());
  row.source = c->source;
  row.plan_json = c->plan_json;
  if (call.name == "submit") {
    row.result = "submitted: the candidate is judged now on the judging input sets";
    return row;
  }
  if (call.name == "profile") {
    KS_ASSIGN_OR_RETURN(CounterReport report, host->Profile(*c));
    if (report.launches.empty())
      return tool_error("no counters: " + (report.note.empty() ? std::string("none were read") : report.note));
    row.status = "profiled";
    row.result = "hardware counters (Nsight Compute, practice input sets):\n" + CountersText(report, "- ", 6000);
    return row;
  }
  if (call.name == "compile") {
    // Compiled and resolved, never run: no verdict, no figures to store.
    KS_ASSIGN_OR_RETURN(Evaluation e, host->CompileOnly(*c));
    const bool failed = e.status == EvalStatus::kCompileError || e.status == EvalStatus::kInvalidPlan;
    row.status = failed ? EvalStatusName(e.status) : "compiled";
    row.result = CompileDigest(e);
    return row;
  }
  KS_ASSIGN_OR_RETURN(Evaluation e, host->Practice(*c));
  row.evaluation_json = EvaluationToJson(e).dump();
  row.status = EvalStatusName(e.status);
  row.result = TestDigest(e, task.signature);
  return row;
}

Message ToolMessage(const store::AttemptRow& row) {
  Message m;
  m.role = "tool";
  m.tool_call_id = row.tool_call_id;
  m.tool_name = row.tool;
  m.text = row.result;
  m.is_error = row.is_error;
  return m;
}

}  // namespace

const char* AgentStopName(AgentStop stop) {
  switch (stop) {
    case AgentStop::kSubmitted: return "submitted";
    case AgentStop::kAnswered: return "answered";
    case AgentStop::kTurns: return "turns";
    case AgentStop::kToolCalls: return "tool calls";
    case AgentStop::kTokens: return "tokens";
    case AgentStop::kRefused: return "refused";
  }
  return "turns";
}

TemplateVars AgentTemplateVars(const AgentLimits& limits, bool profile) {
  TemplateVars v;
  v.Set("max_tool_calls", std::to_string(limits.max_tool_calls));
  v.Set("max_turns", std::to_string(limits.max_turns));
  v.Set("max_tokens", std::to_string(limits.max_tokens));
  v.SetList("profile_offered", profile ? std::vector<TemplateRecord>{{}} : std::vector<TemplateRecord>{});
  v.SetList("token_limit", limits.max_tokens > 0 ? std::vector<TemplateRecord>{{}} : std::vector<TemplateRecord>{});
  return v;
}

StatusOr<AgentText> RenderAgentText(const PromptLibrary& lib, const AgentLimits& limits, bool profile) {
  const std::string file = (lib.dir().empty() ? std::string("prompts") : lib.dir()) + "/agent.md";
  const TemplateVars vars = AgentTemplateVars(limits, profile);
  std::map<std::string, std::string> text;
  for (const char* section : kAgentSections) {
    StatusOr<std::string> r = lib.Render(std::string("agent.") + section, vars);
    if (r.status().code() == Code::kNotFound)
      return NotFound("the agent's text: " + file + " has no section '" + section + "' (a line '{{@ " + section +
                      "}}' starts it)");
    if (!r.ok()) return r.status().WithContext("the agent's text (" + file + ", section '" + section + "')");
    text[section] = std::move(r).value();
  }
  AgentText out;
  out.instructions = text["instructions"];
  // The order the model sees: compile, test, [profile,] submit.
  for (const char* tool : {"compile", "test", "profile", "submit"}) {
    if (std::string(tool) == "profile" && !profile) continue;
    out.tools.push_back({tool, text[tool], CandidateSchema(text["source"], text[std::string(tool) + "_plan"])});
  }
  return out;
}

std::string CompileDigest(const Evaluation& e) {
  if (e.status == EvalStatus::kCompileError)
    return "compile error: " + e.message + "\ncompiler log:\n" + Capped(e.compile_log, kMaxLogChars);
  if (e.status == EvalStatus::kInvalidPlan) return "invalid launch plan: " + e.message;
  std::string out = "compiled (target " + (e.target.empty() ? std::string("default") : e.target) + ")\n";
  if (!e.compile_log.empty()) out += "compiler log:\n" + Capped(e.compile_log, kMaxLogChars) + "\n";
  for (const auto& r : e.resources)
    out += fmt::format("kernel {}: {} registers/thread, {} B static shared, {} B stack frame, spills: {} B stores, "
                       "{} B loads\n",
                       r.kernel, r.registers, r.static_shared_bytes, r.stack_frame_bytes, r.spill_store_bytes,
                       r.spill_load_bytes);
  for (const auto& l : e.launches)
    out += fmt::format("launch {}: grid ({}, {}, {}), block ({}, {}, {}), {} B dynamic shared\n", l.kernel, l.grid[0],
                       l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.shared_bytes);
  return out;
}

std::string TestDigest(const Evaluation& e, const Signature* sig) {
  std::string out = fmt::format("status: {} (practice input sets)\n", EvalStatusName(e.status));
  if (e.status != EvalStatus::kCorrect) out += FailureDetails(e, sig) + "\n";
  for (const auto& o : e.errors)
    if (o.rel_norm_bound > 0)
      out += fmt::format("output {}: relative norm {:.3g} vs its bound {:.3g}, {} mismatches\n", o.name, o.rel_norm,
                         o.rel_norm_bound, o.mismatches);
  if (e.timing) out += "figures: " + FiguresLine(e) + "\n";
  json j = EvaluationToJson(e);
  if (j.contains("launch_profiles") && !j["launch_profiles"].empty())
    out += "per launch: " + j["launch_profiles"].dump() + "\n";
  return out;
}

StatusOr<AgentTrail> LoadAgentTrail(store::LineageStore* store, const store::CandidateRow& candidate) {
  AgentTrail trail;
  KS_ASSIGN_OR_RETURN(trail.attempts, store->ListAttempts(candidate.search_id, candidate.slot_key));
  if (candidate.evaluation) trail.judged_status = EvalStatusName(candidate.evaluation->status);
  for (const auto& a : trail.attempts) {
    if (a.tool != "test" || a.evaluation_json.empty() || a.source != candidate.source) continue;
    if (a.plan_json != candidate.plan_json) continue;
    trail.practice_status = a.status;
    json e = json::parse(a.evaluation_json, nullptr, false);
    trail.practice_ms.reset();
    if (auto ev = EvaluationFromJson(e); ev.ok() && ev->timing) trail.practice_ms = ev->timing->median_ms;
  }
  return trail;
}

std::string AgentTrailText(const AgentTrail& trail, const std::string& indent) {
  if (trail.attempts.empty()) return "";
  std::string out;
  for (const auto& a : trail.attempts) {
    std::string what = a.status.empty() ? "" : a.status;
    if (a.is_error) what += ": " + a.result.substr(0, a.result.find('\n'));
    if (!a.evaluation_json.empty() && a.tool == "test") {
      json e = json::parse(a.evaluation_json, nullptr, false);
      if (auto ev = EvaluationFromJson(e); ev.ok() && ev->timing) what += fmt::format(", {:.4f} ms", ev->timing->median_ms);
    }
    out += fmt::format("{}turn {} {:<8} {}\n", indent, a.turn, a.tool, what);
  }
  if (trail.practice_status.empty()) {
    out += indent + "practice vs judging: the final candidate was not tested on practice sets\n";
  } else {
    out += fmt::format("{}practice vs judging: {} on practice sets, {} when judged{}\n", indent, trail.practice_status,
                       trail.judged_status.empty() ? "pending" : trail.judged_status,
                       trail.disagrees() ? "  <-- DISAGREE (over-fitted to the practice sets?)" : "");
  }
  return out;
}

json AgentTrailJson(const AgentTrail& trail) {
  json attempts = json::array();
  for (const auto& a : trail.attempts)
    attempts.push_back({{"turn", a.turn}, {"call", a.call_index}, {"tool", a.tool}, {"status", a.status},
                        {"is_error", a.is_error}, {"result", a.result}});
  json j = {{"attempts", attempts}, {"practice_status", trail.practice_status},
            {"judged_status", trail.judged_status}, {"practice_disagrees", trail.disagrees()}};
  j["practice_ms"] = trail.practice_ms ? json(*trail.practice_ms) : json();
  return j;
}

StatusOr<AgentOutcome> RunAgent(const AgentTask& task, AgentHost* host) {
  std::optional<PromptLibrary> loaded;
  const PromptLibrary* prompts = task.prompts;
  if (!prompts) {
    KS_ASSIGN_OR_RETURN(loaded, PromptLibrary::LoadDefault());
    prompts = &*loaded;
  }
  KS_ASSIGN_OR_RETURN(AgentText text, RenderAgentText(*prompts, task.limits, task.profile));
  ConversationRequest conv;
  conv.role = "implement";
  conv.system = task.system;
  conv.tools = std::move(text.tools);
  conv.messages.push_back({.role = "user", .text = task.prompt + "\n\n" + text.instructions});
  std::map<std::pair<int, int>, store::AttemptRow> stored;
  // The model's turns are stored under the implementation's slot, one per turn.
  KS_ASSIGN_OR_RETURN(const SlotKey implementation, SlotKey::Parse(task.slot));
  if (implementation.kind != SlotKey::Kind::kImplement)
    return InvalidArgument("an agent implements under an implementation's slot, not '" + task.slot + "'");
  KS_ASSIGN_OR_RETURN(auto rows, host->StoredAttempts(task.slot));
  for (auto& r : rows) stored[{r.turn, r.call_index}] = std::move(r);

  AgentOutcome out;
  std::optional<Candidate> last_correct;
  const AgentLimits& lim = task.limits;
  for (int turn = 0;; ++turn) {
    if (turn >= lim.max_turns) { out.stop = AgentStop::kTurns; break; }
    if (out.tool_calls >= lim.max_tool_calls) { out.stop = AgentStop::kToolCalls; break; }
    if (lim.max_tokens > 0 && out.tokens >= lim.max_tokens) { out.stop = AgentStop::kTokens; break; }
    KS_ASSIGN_OR_RETURN(auto reply, host->Converse(conv, implementation.Turn(turn).Format()));
    if (!reply) { out.stop = AgentStop::kRefused; break; }
    ++out.turns;
    out.tokens += reply->tokens_in + reply->tokens_out;
    conv.messages.push_back(reply->message);
    if (reply->message.tool_calls.empty()) {
      out.final_text = reply->message.text;
      out.stop = AgentStop::kAnswered;
      return out;
    }
    for (int i = 0; i < static_cast<int>(reply->message.tool_calls.size()); ++i) {
      if (out.tool_calls >= lim.max_tool_calls) break;
      const ToolCall& call = reply->message.tool_calls[i];
      store::AttemptRow row;
      if (auto it = stored.find({turn, i}); it != stored.end() && it->second.tool_call_id == call.id) {
        row = it->second;  // resumed: this call ran before the process stopped
      } else {
        KS_ASSIGN_OR_RETURN(row, Execute(task, call, turn, i, host));
        KS_RETURN_IF_ERROR(host->StoreAttempt(row));
      }
      ++out.tool_calls;
      conv.messages.push_back(ToolMessage(row));
      if (row.tool == "test" && row.status == "correct") last_correct = Candidate{row.source, row.plan_json};
      if (row.tool == "submit" && !row.is_error) {
        out.candidate = Candidate{row.source, row.plan_json};
        out.submitted = true;
        out.stop = AgentStop::kSubmitted;
        return out;
      }
    }
  }
  out.candidate = last_correct;
  return out;
}

}  // namespace ks
