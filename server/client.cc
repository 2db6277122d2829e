#include "server/client.h"

#include <chrono>

#include "common/files.h"
#include "server/status_convert.h"

namespace ks::server {

namespace pb = ::kernelsearch::v1;

StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& o) {
  if (o.address.empty()) return InvalidArgument("no server address (--server HOST:PORT or $KS_SERVER)");
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (o.tls_ca.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    KS_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(o.tls_ca, 1 << 20));
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(o.max_receive_bytes);
  auto channel = grpc::CreateCustomChannel(o.address, creds, args);
  return std::unique_ptr<Client>(new Client(o, std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)), channel_(std::move(channel)), stub_(pb::KernelSearch::NewStub(channel_)) {}

void Client::Prepare(grpc::ClientContext* ctx, bool with_deadline) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  if (with_deadline)
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000)));
}

#define KS_CLIENT_UNARY(Method, Req, Resp)                         \
  StatusOr<Resp> Client::Method(const Req& r) {                    \
    grpc::ClientContext ctx;                                       \
    Prepare(&ctx, true);                                           \
    Resp resp;                                                     \
    grpc::Status st = stub_->Method(&ctx, r, &resp);               \
    if (!st.ok()) return FromGrpcStatus(st);                       \
    return resp;                                                   \
  }

KS_CLIENT_UNARY(SubmitProblem, pb::SubmitProblemRequest, pb::SubmitProblemResponse)
KS_CLIENT_UNARY(StartSearch, pb::StartSearchRequest, pb::StartSearchResponse)
KS_CLIENT_UNARY(CancelSearch, pb::CancelSearchRequest, pb::SearchInfo)
KS_CLIENT_UNARY(ContinueSearch, pb::ContinueSearchRequest, pb::SearchInfo)
KS_CLIENT_UNARY(GetSearch, pb::GetSearchRequest, pb::SearchInfo)
KS_CLIENT_UNARY(ListSearches, pb::ListSearchesRequest, pb::ListSearchesResponse)
KS_CLIENT_UNARY(GetBestKernel, pb::GetBestKernelRequest, pb::CandidateDetail)
KS_CLIENT_UNARY(ListCandidates, pb::ListCandidatesRequest, pb::ListCandidatesResponse)
KS_CLIENT_UNARY(GetCandidate, pb::GetCandidateRequest, pb::CandidateDetail)
KS_CLIENT_UNARY(EvaluateKernel, pb::EvaluateKernelRequest, pb::EvaluateKernelResponse)
KS_CLIENT_UNARY(GetReport, pb::GetReportRequest, pb::GetReportResponse)
KS_CLIENT_UNARY(LeaseCandidates, pb::LeaseCandidatesRequest, pb::LeaseCandidatesResponse)
KS_CLIENT_UNARY(RenewLeases, pb::RenewLeasesRequest, pb::RenewLeasesResponse)
KS_CLIENT_UNARY(ReportEvaluation, pb::ReportEvaluationRequest, pb::ReportEvaluationResponse)
KS_CLIENT_UNARY(ReportCounters, pb::ReportCountersRequest, pb::ReportCountersResponse)
KS_CLIENT_UNARY(ReportPractice, pb::ReportPracticeRequest, pb::ReportPracticeResponse)
#undef KS_CLIENT_UNARY

Status Client::Watch(const std::string& search_id, const std::function<void(const pb::SearchEvent&)>& on_event,
                     std::function<void(grpc::ClientContext*)> context_out) {
  grpc::ClientContext ctx;
  Prepare(&ctx, false);
  if (context_out) context_out(&ctx);
  pb::WatchSearchRequest req;
  req.set_search_id(search_id);
  std::unique_ptr<grpc::ClientReader<pb::SearchEvent>> reader = stub_->WatchSearch(&ctx, req);
  pb::SearchEvent ev;
  while (reader->Read(&ev)) on_event(ev);
  grpc::Status st = reader->Finish();
  if (context_out) context_out(nullptr);
  return FromGrpcStatus(st);
}

}  // namespace ks::server
