#include "server/service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "evaluator/profile/counters.h"
#include "search/report.h"
#include "search/search_setup.h"
#include "server/convert.h"
#include "server/status_convert.h"
#include "server/temp_dir.h"

namespace ks::server {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Decodes a page token (the offset into the ordered listing, as decimal).
StatusOr<size_t> ParsePageToken(const std::string& token) {
  if (token.empty()) return size_t{0};
  size_t v = 0;
  for (char c : token) {
    if (c < '0' || c > '9' || v > (size_t{1} << 40)) return InvalidArgument("page_token is malformed");
    v = v * 10 + static_cast<size_t>(c - '0');
  }
  return v;
}

// One WatchSearch stream. Events queue here and go out one write at a time;
// the reactor deletes itself in OnDone. Shared with the hub through
// shared_ptr<Channel>, whose pointer back to the reactor is cut (under mu) when
// the RPC ends, so the hub may outlive the reactor safely.
class WatchReactor : public ::grpc::ServerWriteReactor<pb::SearchEvent> {
 public:
  // Beyond this many undelivered events the watcher is too slow: end its stream
  // rather than let one client hold unbounded server memory.
  static constexpr size_t kMaxQueued = 10000;

  class Channel : public WatchChannel {
   public:
    explicit Channel(WatchReactor* r) : reactor_(r) {}
    void Deliver(const pb::SearchEvent& event, bool last) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (reactor_ != nullptr) reactor_->Enqueue(event, last);
    }
    void Detach() {
      std::lock_guard<std::mutex> lock(mu_);
      reactor_ = nullptr;
    }

   private:
    std::mutex mu_;  // orders Deliver against Detach
    WatchReactor* reactor_;
  };

  WatchReactor(WatchHub* hub) : hub_(hub), channel_(std::make_shared<Channel>(this)) {}

  // Runs the checks and subscribes; on failure finishes the RPC with it.
  void Begin(const std::function<Status()>& checks, int64_t* search_id) {
    grpc::Status st = GuardedCall("WatchSearch", [&]() -> Status {
      KS_RETURN_IF_ERROR(checks());
      search_id_ = *search_id;
      Status sub = hub_->Subscribe(search_id_, channel_);
      if (sub.ok()) subscribed_ = true;
      return sub;
    });
    if (!st.ok()) FinishOnce(st);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {  // the client went away
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher gone"));
      return;
    }
    queue_.pop_front();
    WriteNextLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    channel_->Detach();
    if (subscribed_) hub_->Unsubscribe(search_id_, channel_.get());
    delete this;
  }

 private:
  void Enqueue(const pb::SearchEvent& event, bool last) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    if (queue_.size() >= kMaxQueued) {
      FinishLocked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                "watcher too slow: more than 10000 events undelivered"));
      return;
    }
    queue_.push_back(event);
    last_queued_ = last_queued_ || last;
    WriteNextLocked();
  }

  void WriteNextLocked() {
    if (writing_ || finished_) return;
    if (queue_.empty()) {
      if (last_queued_) FinishLocked(grpc::Status::OK);
      return;
    }
    writing_ = true;
    StartWrite(&queue_.front());
  }

  void FinishLocked(const grpc::Status& st) {
    if (finished_) return;
    finished_ = true;
    Finish(st);
  }

  void FinishOnce(const grpc::Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(st);
  }

  WatchHub* const hub_;
  std::shared_ptr<Channel> channel_;
  int64_t search_id_ = 0;
  bool subscribed_ = false;
  std::mutex mu_;  // guards the fields below
  std::deque<pb::SearchEvent> queue_;  // front() is being written while writing_
  bool writing_ = false;
  bool last_queued_ = false;
  bool finished_ = false;
};

}  // namespace

KernelSearchService::KernelSearchService(ServiceDeps deps) : deps_(std::move(deps)) {
  KS_CHECK(deps_.store && deps_.jobs && deps_.hub && deps_.auth);
}

Status KernelSearchService::Authenticate(const Metadata& metadata) const {
  std::vector<std::string_view> values;
  auto [lo, hi] = metadata.equal_range("authorization");
  for (auto it = lo; it != hi; ++it) values.emplace_back(it->second.data(), it->second.size());
  return deps_.auth->Check(values);
}

grpc::Status KernelSearchService::Handle(const char* method, const Metadata& metadata,
                                         const std::function<Status()>& body) {
  return GuardedCall(method, [&]() -> Status {
    KS_RETURN_IF_ERROR(Authenticate(metadata));
    return body();
  });
}

grpc::Status KernelSearchService::SubmitProblem(grpc::ServerContext* ctx, const pb::SubmitProblemRequest* req,
                                                pb::SubmitProblemResponse* resp) {
  return Handle("SubmitProblem", ctx->client_metadata(), [&]() -> Status {
    const std::string name = req->name().empty() ? "problem" : req->name();
    KS_RETURN_IF_ERROR(ValidateName(name, deps_.limits.max_name_bytes));
    KS_RETURN_IF_ERROR(ValidateSource("source", req->source(), deps_.limits.max_source_bytes));
    if (!deps_.load_signature) return FailedPrecondition("this server cannot load problems");
    KS_ASSIGN_OR_RETURN(TempDir dir, TempDir::Make("ks-submit"));
    // The stem becomes the signature's name, so the file is named after the problem.
    const std::string path = dir.path() + "/" + name + ".py";
    KS_RETURN_IF_ERROR(WriteFile(path, req->source()));
    auto sig = deps_.load_signature(path);
    if (!sig.ok()) {
      // The temp path means nothing to the client: name the problem instead.
      std::string msg = sig.status().message();
      for (size_t at; (at = msg.find(path)) != std::string::npos;) msg.replace(at, path.size(), name + ".py");
      for (size_t at; (at = msg.find(dir.path())) != std::string::npos;) msg.replace(at, dir.path().size(), ".");
      return Status(sig.status().code(), msg);
    }
    store::ProblemRow row;
    row.name = name;
    row.file_path = "submitted:" + name + ".py";
    row.source = req->source();
    row.signature_json = SignatureToJson(*sig).dump();
    row.sha256 = Sha256Hex(req->source());
    KS_ASSIGN_OR_RETURN(int64_t id, deps_.store->PutProblem(row));
    resp->set_problem_id(IdToString(id));
    Signature shown = *sig;
    shown.file = row.file_path;
    FillSignature(shown, resp->mutable_signature());
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::StartSearch(grpc::ServerContext* ctx, const pb::StartSearchRequest* req,
                                              pb::StartSearchResponse* resp) {
  return Handle("StartSearch", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t problem_id, ParseId("problem_id", req->problem_id()));
    KS_ASSIGN_OR_RETURN(pb::SearchConfig config, ValidateSearchConfig(req->config(), deps_.limits.config));
    auto problem = deps_.store->GetProblem(problem_id);
    if (!problem.ok()) return problem.status();
    if (problem->signature_json.empty() || problem->signature_json == "{}")
      return FailedPrecondition("problem " + req->problem_id() + " has no signature yet; submit it again");
    SearchConfig full = ToSearchConfig(config, deps_.search_base);
    if (Status v = full.Validate(); !v.ok()) return InvalidArgument("config: " + v.message());
    std::string config_json = SearchConfigToJson(full).dump();
    KS_ASSIGN_OR_RETURN(int64_t id, deps_.jobs->Submit(problem_id, config_json));
    resp->set_search_id(IdToString(id));
    return Status::Ok();
  });
}

grpc::ServerWriteReactor<pb::SearchEvent>* KernelSearchService::WatchSearch(grpc::CallbackServerContext* ctx,
                                                                           const pb::WatchSearchRequest* req) {
  auto* reactor = new WatchReactor(deps_.hub);
  int64_t search_id = 0;
  reactor->Begin(
      [&]() -> Status {
        KS_RETURN_IF_ERROR(Authenticate(ctx->client_metadata()));
        KS_ASSIGN_OR_RETURN(search_id, ParseId("search_id", req->search_id()));
        return Status::Ok();
      },
      &search_id);
  return reactor;
}

grpc::Status KernelSearchService::CancelSearch(grpc::ServerContext* ctx, const pb::CancelSearchRequest* req,
                                               pb::SearchInfo* resp) {
  return Handle("CancelSearch", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("search_id", req->search_id()));
    KS_RETURN_IF_ERROR(deps_.jobs->Cancel(id));
    KS_ASSIGN_OR_RETURN(store::SearchSummary s, deps_.store->Summarize(id));
    FillSearchInfo(s, resp);
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::ContinueSearch(grpc::ServerContext* ctx, const pb::ContinueSearchRequest* req,
                                                 pb::SearchInfo* resp) {
  return Handle("ContinueSearch", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("search_id", req->search_id()));
    if (req->rounds() <= 0)
      return InvalidArgument("rounds = " + std::to_string(req->rounds()) +
                             ": give the search's new total of rounds (after round 0), more than it ran");
    std::lock_guard<std::mutex> lock(continue_mu_);
    KS_ASSIGN_OR_RETURN(store::SearchRow search, deps_.store->GetSearch(id));
    if (search.status != store::SearchStatus::kFinished)
      return FailedPrecondition("search " + req->search_id() + " is " + store::SearchStatusName(search.status) +
                                ": only a finished search is continued with more rounds");
    KS_RETURN_IF_ERROR(PlanSearchRounds(search, req->rounds()).status());
    auto stored = SearchConfigFromJson(nlohmann::json::parse(search.config_json, nullptr, false));
    if (!stored.ok()) return stored.status().WithContext("search " + req->search_id() + " config");
    // Bounded like a new search's shape: the stored one with the new total.
    pb::SearchConfig shape = FromSearchConfig(*stored);
    shape.set_rounds(req->rounds());
    KS_RETURN_IF_ERROR(ValidateSearchConfig(shape, deps_.limits.config).status());
    if (!deps_.queue_search) return FailedPrecondition("this server cannot continue searches");
    KS_ASSIGN_OR_RETURN(RoundsChange change, SetSearchRounds(deps_.store, id, req->rounds()));
    if (Status queued = deps_.queue_search(id); !queued.ok()) {
      // Not queued: finished as before, so that nothing runs it behind the caller's back.
      stored->rounds = change.before;
      KS_RETURN_IF_ERROR(deps_.store->SetSearchConfig(id, SearchConfigToJson(*stored).dump()));
      KS_RETURN_IF_ERROR(deps_.store->SetSearchStatus(id, search.status, search.stop_reason));
      return queued;
    }
    KS_ASSIGN_OR_RETURN(store::SearchSummary s, deps_.store->Summarize(id));
    FillSearchInfo(s, resp);
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::GetSearch(grpc::ServerContext* ctx, const pb::GetSearchRequest* req,
                                            pb::SearchInfo* resp) {
  return Handle("GetSearch", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("search_id", req->search_id()));
    KS_ASSIGN_OR_RETURN(store::SearchSummary s, deps_.store->Summarize(id));
    FillSearchInfo(s, resp);
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::GetReport(grpc::ServerContext* ctx, const pb::GetReportRequest* req,
                                            pb::GetReportResponse* resp) {
  return Handle("GetReport", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("search_id", req->search_id()));
    KS_ASSIGN_OR_RETURN(std::string html, RenderReportHtml(deps_.store, id));
    resp->set_html(std::move(html));
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::ListSearches(grpc::ServerContext* ctx, const pb::ListSearchesRequest* req,
                                               pb::ListSearchesResponse* resp) {
  return Handle("ListSearches", ctx->client_metadata(), [&]() -> Status {
    int64_t problem_id = 0;
    if (!req->problem_id().empty()) {
      KS_ASSIGN_OR_RETURN(problem_id, ParseId("problem_id", req->problem_id()));
      KS_RETURN_IF_ERROR(deps_.store->GetProblem(problem_id).status());
    }
    KS_ASSIGN_OR_RETURN(int page, ResolvePageSize(req->page_size(), deps_.limits));
    KS_ASSIGN_OR_RETURN(size_t offset, ParsePageToken(req->page_token()));
    KS_ASSIGN_OR_RETURN(std::vector<store::SearchSummary> all, deps_.store->History(problem_id));
    for (size_t i = offset; i < all.size() && i < offset + page; ++i) FillSearchInfo(all[i], resp->add_searches());
    if (offset + page < all.size()) resp->set_next_page_token(std::to_string(offset + page));
    return Status::Ok();
  });
}

Status KernelSearchService::FillDetail(int64_t candidate_id, pb::CandidateDetail* out) {
  KS_ASSIGN_OR_RETURN(store::CandidateRow c, deps_.store->GetCandidate(candidate_id));
  FillCandidateSummary(c, out->mutable_summary());
  out->set_source(c.source);
  out->set_plan_json(c.plan_json);
  if (c.evaluation) out->set_evaluation_json(c.evaluation->evaluation_json);
  if (c.idea_id) {
    auto idea = deps_.store->GetIdea(*c.idea_id);
    if (idea.ok()) out->set_idea_text(idea->text);
  }
  KS_ASSIGN_OR_RETURN(std::vector<store::CandidateRow> lineage, deps_.store->Lineage(candidate_id));
  // The store gives root first, ending with the candidate itself; the API
  // lists ancestors nearest first.
  for (auto it = lineage.rbegin(); it != lineage.rend(); ++it) {
    if (it->id == candidate_id) continue;
    FillCandidateSummary(*it, out->add_lineage());
  }
  return Status::Ok();
}

grpc::Status KernelSearchService::GetBestKernel(grpc::ServerContext* ctx, const pb::GetBestKernelRequest* req,
                                                pb::CandidateDetail* resp) {
  return Handle("GetBestKernel", ctx->client_metadata(), [&]() -> Status {
    if (req->search_id().empty() == req->problem_id().empty())
      return InvalidArgument("give exactly one of search_id and problem_id");
    std::optional<store::CandidateRow> best;
    if (!req->search_id().empty()) {
      KS_ASSIGN_OR_RETURN(int64_t id, ParseId("search_id", req->search_id()));
      KS_RETURN_IF_ERROR(deps_.store->GetSearch(id).status());
      KS_ASSIGN_OR_RETURN(best, deps_.store->BestCorrect(id));
    } else {
      KS_ASSIGN_OR_RETURN(int64_t id, ParseId("problem_id", req->problem_id()));
      KS_RETURN_IF_ERROR(deps_.store->GetProblem(id).status());
      KS_ASSIGN_OR_RETURN(best, deps_.store->BestCorrectForProblem(id));
    }
    if (!best) return NotFound("no correct kernel yet");
    return FillDetail(best->id, resp);
  });
}

grpc::Status KernelSearchService::ListCandidates(grpc::ServerContext* ctx, const pb::ListCandidatesRequest* req,
                                                 pb::ListCandidatesResponse* resp) {
  return Handle("ListCandidates", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("search_id", req->search_id()));
    std::optional<EvalStatus> want;
    if (!req->status().empty()) {
      KS_ASSIGN_OR_RETURN(EvalStatus s, ParseEvalStatus(req->status()));
      want = s;
    }
    if (req->round() < 0) return InvalidArgument("round must not be negative");
    KS_ASSIGN_OR_RETURN(int page, ResolvePageSize(req->page_size(), deps_.limits));
    KS_ASSIGN_OR_RETURN(size_t offset, ParsePageToken(req->page_token()));
    KS_RETURN_IF_ERROR(deps_.store->GetSearch(id).status());
    KS_ASSIGN_OR_RETURN(std::vector<store::CandidateRow> all, deps_.store->ListCandidates(id));
    std::vector<const store::CandidateRow*> kept;
    for (const auto& c : all) {
      if (want && (!c.evaluation || c.evaluation->status != *want)) continue;
      if (req->correct_only() && (!c.evaluation || c.evaluation->status != EvalStatus::kCorrect)) continue;
      if (req->round() > 0 && c.round != req->round()) continue;
      kept.push_back(&c);
    }
    for (size_t i = offset; i < kept.size() && i < offset + page; ++i)
      FillCandidateSummary(*kept[i], resp->add_candidates());
    if (offset + page < kept.size()) resp->set_next_page_token(std::to_string(offset + page));
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::GetCandidate(grpc::ServerContext* ctx, const pb::GetCandidateRequest* req,
                                               pb::CandidateDetail* resp) {
  return Handle("GetCandidate", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("candidate_id", req->candidate_id()));
    return FillDetail(id, resp);
  });
}

grpc::Status KernelSearchService::EvaluateKernel(grpc::ServerContext* ctx, const pb::EvaluateKernelRequest* req,
                                                 pb::EvaluateKernelResponse* resp) {
  return Handle("EvaluateKernel", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("problem_id", req->problem_id()));
    KS_RETURN_IF_ERROR(ValidateSource("source", req->source(), deps_.limits.max_source_bytes));
    KS_RETURN_IF_ERROR(ValidateSource("plan_json", req->plan_json(), deps_.limits.max_plan_bytes));
    KS_ASSIGN_OR_RETURN(store::ProblemRow problem, deps_.store->GetProblem(id));
    if (!deps_.make_evaluator)
      return FailedPrecondition("this server cannot evaluate kernels (started without a GPU evaluator)");
    // The GPUs are shared with the running searches: a bounded number of
    // user evaluations at once, the rest are told to come back.
    if (evaluations_in_flight_.fetch_add(1) >= deps_.max_concurrent_evaluations) {
      evaluations_in_flight_.fetch_sub(1);
      return ResourceExhausted("too many kernel evaluations in flight; try again later");
    }
    struct Release {
      std::atomic<int>* n;
      ~Release() { n->fetch_sub(1); }
    } release{&evaluations_in_flight_};
    KS_ASSIGN_OR_RETURN(std::unique_ptr<CandidateEvaluator> evaluator, deps_.make_evaluator(problem));
    Candidate cand{req->source(), req->plan_json()};
    KS_ASSIGN_OR_RETURN(std::vector<Evaluation> evals, evaluator->EvaluateBatch({cand}));
    if (evals.size() != 1) return Internal("the evaluator returned " + std::to_string(evals.size()) + " results for 1");
    const Evaluation& e = evals.front();
    resp->set_status(EvalStatusName(e.status));
    resp->set_message(e.message);
    if (e.timing) resp->set_median_ms(e.timing->median_ms);
    resp->set_speedup_eager(e.speedup_eager.value_or(0));
    resp->set_speedup_compile(e.speedup_compile.value_or(0));
    resp->set_evaluation_json(EvaluationToJson(e).dump());
    return Status::Ok();
  });
}

// ---- GPU workers (issue 13) ----

grpc::Status KernelSearchService::LeaseCandidates(grpc::ServerContext* ctx, const pb::LeaseCandidatesRequest* req,
                                                  pb::LeaseCandidatesResponse* resp) {
  return Handle("LeaseCandidates", ctx->client_metadata(), [&]() -> Status {
    const ServerLimits& lim = deps_.limits;
    if (req->worker().size() > lim.max_worker_name_bytes)
      return InvalidArgument("worker name is longer than " + std::to_string(lim.max_worker_name_bytes) + " bytes");
    if (req->max_candidates() < 0) return InvalidArgument("max_candidates must not be negative");
    int max = std::min(std::max(1, req->max_candidates()), lim.max_lease_candidates);
    KS_ASSIGN_OR_RETURN(double lease_s, ResolveLeaseSeconds(req->lease_seconds(), lim));
    const std::string worker = req->worker().empty() ? ctx->peer() : req->worker();
    int64_t prefer = 0;
    if (!req->prefer_problem_id().empty()) {
      KS_ASSIGN_OR_RETURN(prefer, ParseId("prefer_problem_id", req->prefer_problem_id()));
    }
    // Agents' practice calls first: a model conversation waits on each (issue 32).
    KS_ASSIGN_OR_RETURN(int practice, LeasePracticeCalls(*req, worker, lease_s, max, resp));
    std::vector<store::LeasedCandidateRow> leased;
    if (practice < max) {
      KS_ASSIGN_OR_RETURN(leased, deps_.store->LeaseCandidates(worker, max - practice, lease_s, NowSeconds(), prefer));
    }
    resp->set_lease_seconds(lease_s);
    for (const auto& l : leased) {
      pb::LeasedCandidate* out = resp->add_candidates();
      out->set_candidate_id(IdToString(l.candidate.id));
      out->set_lease_id(l.lease_id);
      out->set_problem_id(IdToString(l.problem_id));
      out->set_source(l.candidate.source);
      out->set_plan_json(l.candidate.plan_json);
      out->set_attempts(l.attempts);
      out->set_precision(l.precision);
      out->set_allow_degenerate(l.allow_degenerate);
      KS_RETURN_IF_ERROR(AddLeasedProblem(l.problem_id, resp));
    }
    if (!leased.empty()) {
      std::string ids;
      for (const auto& l : leased)
        ids += (ids.empty() ? "" : ",") + std::to_string(l.candidate.id) +
               (l.attempts > 1 ? "(attempt " + std::to_string(l.attempts) + ")" : "");
      std::fprintf(stderr, "kernelsearch serve: leased candidate(s) %s to %s for %gs\n", ids.c_str(), worker.c_str(),
                   lease_s);
    }
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::RenewLeases(grpc::ServerContext* ctx, const pb::RenewLeasesRequest* req,
                                              pb::RenewLeasesResponse* resp) {
  return Handle("RenewLeases", ctx->client_metadata(), [&]() -> Status {
    if (req->lease_ids_size() > 1024) return ResourceExhausted("at most 1024 lease ids per call");
    std::vector<std::string> ids;
    for (const auto& id : req->lease_ids()) {
      KS_RETURN_IF_ERROR(ValidateLeaseId(id));
      ids.push_back(id);
    }
    KS_ASSIGN_OR_RETURN(double lease_s, ResolveLeaseSeconds(req->lease_seconds(), deps_.limits));
    KS_ASSIGN_OR_RETURN(std::vector<std::string> lost,
                        deps_.store->RenewLeases(ids, lease_s, NowSeconds(), req->release()));
    for (auto& id : lost) resp->add_lost(std::move(id));
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::ReportEvaluation(grpc::ServerContext* ctx, const pb::ReportEvaluationRequest* req,
                                                   pb::ReportEvaluationResponse* resp) {
  return Handle("ReportEvaluation", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("candidate_id", req->candidate_id()));
    KS_RETURN_IF_ERROR(ValidateLeaseId(req->lease_id()));
    if (!req->reference_refusal().empty()) {
      // The worker's GPU found the reference degenerate: the search fails saying
      // what to do (the same message as the CLI's); nothing is stored.
      KS_RETURN_IF_ERROR(ValidateSource("reference_refusal", req->reference_refusal(), 64 << 10));
      int64_t search_id = 0;
      KS_RETURN_IF_ERROR(
          deps_.store->RefuseLease(id, req->lease_id(), req->reference_refusal(), NowSeconds(), &search_id));
      deps_.hub->Poke(search_id);
      resp->set_stored(0);
      return Status::Ok();
    }
    KS_RETURN_IF_ERROR(
        ValidateSource("evaluation_json", req->evaluation_json(), deps_.limits.max_evaluation_bytes));
    nlohmann::json j = nlohmann::json::parse(req->evaluation_json(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return InvalidArgument("evaluation_json is not a JSON object");
    auto evaluation = EvaluationFromJson(j);
    if (!evaluation.ok()) return InvalidArgument("evaluation_json: " + evaluation.status().message());
    std::optional<GpuFacts> facts;
    if (!req->gpu_facts_json().empty()) {
      KS_RETURN_IF_ERROR(ValidateSource("gpu_facts_json", req->gpu_facts_json(), 64 << 10));
      nlohmann::json f = nlohmann::json::parse(req->gpu_facts_json(), nullptr, /*allow_exceptions=*/false);
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
        return InvalidArgument("gpu_facts_json is not a GPU facts object");
      facts = GpuFactsFromJson(f);
      if (facts->name.empty() || facts->name.size() > 256) return InvalidArgument("gpu_facts_json: bad GPU name");
    }
    KS_ASSIGN_OR_RETURN(store::LineageStore::LeaseCompletion done,
                        deps_.store->CompleteLease(id, req->lease_id(), *evaluation, NowSeconds()));
    // Re-serialized: only the fields the prompts know reach the store.
    if (facts) {
      KS_RETURN_IF_ERROR(
          deps_.store->PutGpuFacts(facts->name, GpuFactsToJson(*facts).dump(), done.searches.front()));
    }
    // The search's best kernel, as the orchestrator keeps it after a batch.
    for (int64_t s : done.searches) {
      KS_ASSIGN_OR_RETURN(auto best, deps_.store->BestCorrect(s));
      if (best) KS_RETURN_IF_ERROR(deps_.store->SetBestCandidate(s, best->id));
      deps_.hub->Poke(s);
    }
    resp->set_stored(static_cast<int32_t>(done.stored));
    if (evaluation->correct()) {
      KS_ASSIGN_OR_RETURN(bool wanted, deps_.store->WantsCounters(id));
      resp->set_read_counters(wanted);
    }
    return Status::Ok();
  });
}

grpc::Status KernelSearchService::ReportCounters(grpc::ServerContext* ctx, const pb::ReportCountersRequest* req,
                                                 pb::ReportCountersResponse* /*resp*/) {
  return Handle("ReportCounters", ctx->client_metadata(), [&]() -> Status {
    KS_ASSIGN_OR_RETURN(int64_t id, ParseId("candidate_id", req->candidate_id()));
    KS_RETURN_IF_ERROR(ValidateSource("counters_json", req->counters_json(), 256 << 10));
    nlohmann::json j = nlohmann::json::parse(req->counters_json(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return InvalidArgument("counters_json is not a JSON object");
    // Only what was asked for (a correct kernel without counters), and
    // re-serialized: only the fields the prompts know reach the store.
    KS_ASSIGN_OR_RETURN(bool wanted, deps_.store->WantsCounters(id));
    if (!wanted) return FailedPrecondition("candidate " + req->candidate_id() + "'s counters were not asked for");
    KS_RETURN_IF_ERROR(deps_.store->SetEvaluationCounters(id, CounterReportToJson(CounterReportFromJson(j))));
    KS_ASSIGN_OR_RETURN(store::CandidateRow c, deps_.store->GetCandidate(id));
    deps_.hub->Poke(c.search_id);
    return Status::Ok();
  });
}

}  // namespace ks::server
