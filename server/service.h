// The KernelSearch gRPC service: validates and authenticates every call, then
// hands it to the store (browsing), the job manager (searches), the watch hub
// (streams), the problem loader (SubmitProblem) and an evaluator (EvaluateKernel).
// Unary methods use the sync API (a bounded thread pool set by the server);
// WatchSearch uses the callback API, so a watcher holds no thread while it waits.
//
// Ownership: borrows everything in ServiceDeps; all must outlive the service.
// Thread-safety: gRPC calls the methods from many threads at once.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "evaluator/evaluator_api.h"
#include "evaluator/signature.h"
#include "proto/kernelsearch.grpc.pb.h"
#include "search/search_config.h"
#include "store/lineage_store.h"
#include "server/auth.h"
#include "server/job_manager.h"
#include "server/limits.h"
#include "server/practice_calls.h"
#include "server/watch_hub.h"

namespace ks::server {

struct ServiceDeps {
  store::LineageStore* store = nullptr;
  JobManager* jobs = nullptr;
  WatchHub* hub = nullptr;
  const TokenAuth* auth = nullptr;
  ServerLimits limits;
  // Loads a problem file's signature (the reference bridge). InvalidArgument for
  // a defective problem; FailedPrecondition when python3+torch is missing.
  std::function<StatusOr<Signature>(const std::string& path)> load_signature;
  // Builds an evaluator for a stored problem. Null, or FailedPrecondition from
  // it, when this server cannot evaluate (no GPU).
  std::function<StatusOr<std::unique_ptr<CandidateEvaluator>>(const store::ProblemRow& problem)> make_evaluator;
  // What every search starts from: the server's model, roles, GPU facts. The
  // client's validated config overrides the shape and the budgets.
  SearchConfig search_base;
  int max_concurrent_evaluations = 1;  // EvaluateKernel calls at once; more: RESOURCE_EXHAUSTED
  // Agents' practice calls for GPU workers (issue 32; `--evaluator workers`).
  // Null: this server leases none (it has a GPU of its own).
  PracticeCalls* practice_calls = nullptr;
  // Queues a stored search that is pending again because ContinueSearch gave
  // it more rounds, to run like a search resumed when the server starts: the
  // job manager's resume path. ResourceExhausted when the queue is full,
  // FailedPrecondition when it is queued or running already. Null: this
  // server cannot continue searches (ContinueSearch is FAILED_PRECONDITION).
  std::function<Status(int64_t search_id)> queue_search;
};

class KernelSearchService final
    : public ::kernelsearch::v1::KernelSearch::WithCallbackMethod_WatchSearch<
          ::kernelsearch::v1::KernelSearch::Service> {
 public:
  explicit KernelSearchService(ServiceDeps deps);

  ::grpc::Status SubmitProblem(::grpc::ServerContext* ctx, const ::kernelsearch::v1::SubmitProblemRequest* req,
                               ::kernelsearch::v1::SubmitProblemResponse* resp) override;
  ::grpc::Status StartSearch(::grpc::ServerContext* ctx, const ::kernelsearch::v1::StartSearchRequest* req,
                             ::kernelsearch::v1::StartSearchResponse* resp) override;
  ::grpc::ServerWriteReactor<::kernelsearch::v1::SearchEvent>* WatchSearch(
      ::grpc::CallbackServerContext* ctx, const ::kernelsearch::v1::WatchSearchRequest* req) override;
  ::grpc::Status CancelSearch(::grpc::ServerContext* ctx, const ::kernelsearch::v1::CancelSearchRequest* req,
                              ::kernelsearch::v1::SearchInfo* resp) override;
  ::grpc::Status ContinueSearch(::grpc::ServerContext* ctx, const ::kernelsearch::v1::ContinueSearchRequest* req,
                                ::kernelsearch::v1::SearchInfo* resp) override;
  ::grpc::Status GetReport(::grpc::ServerContext* ctx, const ::kernelsearch::v1::GetReportRequest* req,
                           ::kernelsearch::v1::GetReportResponse* resp) override;
  ::grpc::Status GetSearch(::grpc::ServerContext* ctx, const ::kernelsearch::v1::GetSearchRequest* req,
                           ::kernelsearch::v1::SearchInfo* resp) override;
  ::grpc::Status ListSearches(::grpc::ServerContext* ctx, const ::kernelsearch::v1::ListSearchesRequest* req,
                              ::kernelsearch::v1::ListSearchesResponse* resp) override;
  ::grpc::Status GetBestKernel(::grpc::ServerContext* ctx, const ::kernelsearch::v1::GetBestKernelRequest* req,
                               ::kernelsearch::v1::CandidateDetail* resp) override;
  ::grpc::Status ListCandidates(::grpc::ServerContext* ctx, const ::kernelsearch::v1::ListCandidatesRequest* req,
                                ::kernelsearch::v1::ListCandidatesResponse* resp) override;
  ::grpc::Status GetCandidate(::grpc::ServerContext* ctx, const ::kernelsearch::v1::GetCandidateRequest* req,
                              ::kernelsearch::v1::CandidateDetail* resp) override;
  ::grpc::Status EvaluateKernel(::grpc::ServerContext* ctx, const ::kernelsearch::v1::EvaluateKernelRequest* req,
                                ::kernelsearch::v1::EvaluateKernelResponse* resp) override;
  // GPU workers (issue 13): leases on pending candidates, stored in the lineage store.
  ::grpc::Status LeaseCandidates(::grpc::ServerContext* ctx, const ::kernelsearch::v1::LeaseCandidatesRequest* req,
                                 ::kernelsearch::v1::LeaseCandidatesResponse* resp) override;
  ::grpc::Status RenewLeases(::grpc::ServerContext* ctx, const ::kernelsearch::v1::RenewLeasesRequest* req,
                             ::kernelsearch::v1::RenewLeasesResponse* resp) override;
  ::grpc::Status ReportEvaluation(::grpc::ServerContext* ctx, const ::kernelsearch::v1::ReportEvaluationRequest* req,
                                  ::kernelsearch::v1::ReportEvaluationResponse* resp) override;
  ::grpc::Status ReportCounters(::grpc::ServerContext* ctx, const ::kernelsearch::v1::ReportCountersRequest* req,
                                ::kernelsearch::v1::ReportCountersResponse* resp) override;
  // Agents' practice calls (issue 32; service_practice.cc).
  ::grpc::Status ReportPractice(::grpc::ServerContext* ctx, const ::kernelsearch::v1::ReportPracticeRequest* req,
                                ::kernelsearch::v1::ReportPracticeResponse* resp) override;

 private:
  // Authenticates, then runs `body` through GuardedCall (the one translator).
  using Metadata = std::multimap<::grpc::string_ref, ::grpc::string_ref>;
  ::grpc::Status Handle(const char* method, const Metadata& metadata, const std::function<Status()>& body);
  Status Authenticate(const Metadata& metadata) const;
  Status FillDetail(int64_t candidate_id, ::kernelsearch::v1::CandidateDetail* out);
  // LeaseCandidates' first part: pending practice calls for a worker that
  // serves them, up to `max`, with their problems (service_practice.cc).
  // Returns how many were leased.
  StatusOr<int> LeasePracticeCalls(const ::kernelsearch::v1::LeaseCandidatesRequest& req, const std::string& worker,
                                   double lease_s, int max, ::kernelsearch::v1::LeaseCandidatesResponse* resp);
  Status AddLeasedProblem(int64_t problem_id, ::kernelsearch::v1::LeaseCandidatesResponse* resp);

  ServiceDeps deps_;
  std::atomic<int> evaluations_in_flight_{0};
  // One ContinueSearch at a time: a search is reopened and queued once, not
  // by two calls that both saw it finished.
  std::mutex continue_mu_;
};

}  // namespace ks::server
