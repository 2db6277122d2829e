// The service's part in agents' practice calls through GPU workers (issue 32,
// server/practice_calls.h): leasing them to a worker ahead of candidates, and
// storing what the worker reports. Authenticated and bounded like the other
// worker RPCs.
#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"
#include "server/convert.h"
#include "server/service.h"

namespace ks::server {
namespace {

namespace pb = ::kernelsearch::v1;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The worker's result re-serialized through the type the tool answers with,
// so that only fields this build knows reach the store and the agent.
StatusOr<std::string> CheckedResult(store::PracticeTool tool, const std::string& text, size_t max_bytes) {
  KS_RETURN_IF_ERROR(ValidateSource("result_json", text, max_bytes));
  KS_RETURN_IF_ERROR(CheckJsonNesting(text, kMaxModelJsonDepth, "result_json"));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument("result_json is not a JSON object");
  if (tool == store::PracticeTool::kProfile) return CounterReportToJson(CounterReportFromJson(j)).dump();
  auto e = EvaluationFromJson(j);
  if (!e.ok()) return InvalidArgument("result_json: " + e.status().message());
  return EvaluationToJson(*e).dump();
}

}  // namespace

Status KernelSearchService::AddLeasedProblem(int64_t problem_id, pb::LeaseCandidatesResponse* resp) {
  const std::string key = IdToString(problem_id);
  if (resp->problems().count(key)) return Status::Ok();
  KS_ASSIGN_OR_RETURN(store::ProblemRow p, deps_.store->GetProblem(problem_id));
  pb::LeasedProblem& lp = (*resp->mutable_problems())[key];
  lp.set_name(p.name);
  lp.set_source(p.source);
  lp.set_sha256(p.sha256);
  return Status::Ok();
}

StatusOr<int> KernelSearchService::LeasePracticeCalls(const pb::LeaseCandidatesRequest& req,
                                                      const std::string& worker, double lease_s, int max,
                                                      pb::LeaseCandidatesResponse* resp) {
  if (!deps_.practice_calls || !req.serves_practice()) return 0;
  deps_.practice_calls->WorkerSeen(req.reads_counters());
  const double practice_s = std::min(lease_s, deps_.limits.practice_lease_s);
  resp->set_practice_lease_seconds(practice_s);
  KS_ASSIGN_OR_RETURN(std::vector<store::LeasedPracticeCallRow> leased,
                      deps_.store->LeasePracticeCalls(worker, max, practice_s, NowSeconds(), req.reads_counters()));
  std::string ids;
  for (const auto& l : leased) {
    pb::LeasedPracticeCall* out = resp->add_practice_calls();
    out->set_id(IdToString(l.call.id));
    out->set_lease_id(l.lease_id);
    out->set_problem_id(IdToString(l.problem_id));
    out->set_tool(store::PracticeToolName(l.call.tool));
    out->set_source(l.call.source);
    out->set_plan_json(l.call.plan_json);
    out->set_precision(l.precision);
    out->set_attempts(l.call.attempts);
    KS_RETURN_IF_ERROR(AddLeasedProblem(l.problem_id, resp));
    ids += (ids.empty() ? "" : ",") + std::to_string(l.call.id) + "(" + store::PracticeToolName(l.call.tool) +
           (l.call.attempts > 1 ? ", attempt " + std::to_string(l.call.attempts) : "") + ")";
  }
  if (!leased.empty())
    std::fprintf(stderr, "kernelsearch serve: leased practice call(s) %s to %s for %gs\n", ids.c_str(),
                 worker.c_str(), practice_s);
  return static_cast<int>(leased.size());
}

grpc::Status KernelSearchService::ReportPractice(grpc::ServerContext* ctx, const pb::ReportPracticeRequest* req,
                                                 pb::ReportPracticeResponse* /*resp*/) {
  return Handle("ReportPractice", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("id", req->id()));
    KS_RETURN_IF_ERROR(ValidateLeaseId(req->lease_id()));
    if (!deps_.practice_calls) return FailedPrecondition("this server leases no practice calls");
    KS_ASSIGN_OR_RETURN(store::PracticeCallRow call, deps_.store->GetPracticeCall(id));
    std::string result, error;
    if (!req->error().empty()) {
      KS_RETURN_IF_ERROR(ValidateSource("error", req->error(), 64 << 10));
      error = req->error();
    } else {
      KS_ASSIGN_OR_RETURN(result, CheckedResult(call.tool, req->result_json(), deps_.limits.max_evaluation_bytes));
    }
    KS_RETURN_IF_ERROR(deps_.store->CompletePracticeCall(id, req->lease_id(), result, error, NowSeconds()));
    std::fprintf(stderr, "kernelsearch serve: practice call %lld (%s) %s\n", static_cast<long long>(id),
                 store::PracticeToolName(call.tool), error.empty() ? "answered" : ("failed: " + error).c_str());
    deps_.practice_calls->Poke();
    return Status::Ok();
  });
}

}  // namespace ks::server
