// A client of the KernelSearch service, for the CLI (submit, watch, cancel,
// remote browsing), the end-to-end tests and the load benchmark. Adds the
// bearer token and a deadline to every call and turns grpc::Status into
// ks::Status (FromGrpcStatus).
//
// Thread-safety: a Client may be used from many threads at once (the stub and
// channel are thread-safe). Owns its channel.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "proto/kernelsearch.grpc.pb.h"

namespace ks::server {

struct ClientOptions {
  std::string address;     // host:port
  std::string token;       // sent as "authorization: Bearer <token>"; "" sends none
  std::string tls_ca;      // PEM file of the CA that signed the server's certificate; "" = plain (loopback)
  double timeout_s = 120;  // per unary call (SubmitProblem runs the reference bridge)
  int max_receive_bytes = 64 << 20;
};

class Client {
 public:
  static StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  StatusOr<::kernelsearch::v1::SubmitProblemResponse> SubmitProblem(const ::kernelsearch::v1::SubmitProblemRequest& r);
  StatusOr<::kernelsearch::v1::StartSearchResponse> StartSearch(const ::kernelsearch::v1::StartSearchRequest& r);
  StatusOr<::kernelsearch::v1::SearchInfo> CancelSearch(const ::kernelsearch::v1::CancelSearchRequest& r);
  StatusOr<::kernelsearch::v1::SearchInfo> ContinueSearch(const ::kernelsearch::v1::ContinueSearchRequest& r);
  StatusOr<::kernelsearch::v1::SearchInfo> GetSearch(const ::kernelsearch::v1::GetSearchRequest& r);
  StatusOr<::kernelsearch::v1::ListSearchesResponse> ListSearches(const ::kernelsearch::v1::ListSearchesRequest& r);
  StatusOr<::kernelsearch::v1::CandidateDetail> GetBestKernel(const ::kernelsearch::v1::GetBestKernelRequest& r);
  StatusOr<::kernelsearch::v1::ListCandidatesResponse> ListCandidates(
      const ::kernelsearch::v1::ListCandidatesRequest& r);
  StatusOr<::kernelsearch::v1::CandidateDetail> GetCandidate(const ::kernelsearch::v1::GetCandidateRequest& r);
  StatusOr<::kernelsearch::v1::EvaluateKernelResponse> EvaluateKernel(
      const ::kernelsearch::v1::EvaluateKernelRequest& r);
  StatusOr<::kernelsearch::v1::GetReportResponse> GetReport(const ::kernelsearch::v1::GetReportRequest& r);
  StatusOr<::kernelsearch::v1::LeaseCandidatesResponse> LeaseCandidates(
      const ::kernelsearch::v1::LeaseCandidatesRequest& r);
  StatusOr<::kernelsearch::v1::RenewLeasesResponse> RenewLeases(const ::kernelsearch::v1::RenewLeasesRequest& r);
  StatusOr<::kernelsearch::v1::ReportEvaluationResponse> ReportEvaluation(
      const ::kernelsearch::v1::ReportEvaluationRequest& r);
  StatusOr<::kernelsearch::v1::ReportCountersResponse> ReportCounters(const ::kernelsearch::v1::ReportCountersRequest& r);
  StatusOr<::kernelsearch::v1::ReportPracticeResponse> ReportPractice(const ::kernelsearch::v1::ReportPracticeRequest& r);

  // Follows a search: calls `on_event` for each event (the snapshot first)
  // until the stream ends. OK when the server ended it (after `finished`);
  // otherwise the stream's error. No deadline: a search may run for hours.
  // `context_out`, when set, receives the call's context so another thread
  // can TryCancel() it (valid until Watch returns).
  Status Watch(const std::string& search_id, const std::function<void(const ::kernelsearch::v1::SearchEvent&)>& on_event,
               std::function<void(grpc::ClientContext*)> context_out = nullptr);

  ::kernelsearch::v1::KernelSearch::Stub* stub() { return stub_.get(); }
  // A context with the token and the unary deadline, for direct stub use.
  void Prepare(grpc::ClientContext* ctx, bool with_deadline) const;

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<::kernelsearch::v1::KernelSearch::Stub> stub_;
};

}  // namespace ks::server
