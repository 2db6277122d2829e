#include "server/gpu_worker.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"
#include "search/scripted_evaluator.h"
#include "search/search_config.h"
#include "search/search_setup.h"
#include "server/orchestrator_runner.h"

namespace ks::server {
namespace {

namespace pb = ::kernelsearch::v1;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Worth retrying: the server is restarting, overloaded or briefly unreachable.
bool Transient(const Status& st) {
  return st.code() == Code::kUnavailable || st.code() == Code::kDeadlineExceeded ||
         st.code() == Code::kResourceExhausted || st.code() == Code::kInternal;
}

// Whether the evaluators this worker makes will read hardware counters
// (CandidateEvaluator::CanReadCounters), asked before any is made: the GPU
// evaluator's where ncu is found, a scripted one's when told counters.
bool ReadsCountersUpFront(const EvaluatorOptions& eo) {
  if (eo.spec == "fake") return false;
  if (eo.spec.rfind("fake:", 0) == 0) {
    auto o = LoadScriptedEvaluatorOptions(eo.spec.substr(5));
    return o.ok() && o->counters.has_value();
  }
  return !FindNcu().empty();
}

// The contract a lease names (its search's; "" from a server that predates
// contracts: highest), parsed where it enters the worker.
StatusOr<Contract> LeasedContract(const std::string& name) {
  if (name.empty()) return Contract::kHighest;
  return ParseContract(name);
}

}  // namespace

// What one GPU thread has loaded: the evaluators of one problem text under one
// precision contract (their references hold GPU memory), with the agents'
// practice evaluator once a practice call asked for it.
struct GpuWorker::LoadedProblem {
  std::string problem_id;  // for lease affinity
  std::string sha;         // of the problem's source
  Contract precision = Contract::kHighest;  // the contract it judges under (each candidate's search's)
  std::unique_ptr<StoredProblemEvaluators> evaluators;
  std::string refusal;     // why the reference cannot judge kernels ("" = it can)
};

std::string DefaultWorkerName() {
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  std::string name = std::string(host) + "/" + std::to_string(getpid());
  if (const char* job = std::getenv("SLURM_JOB_ID")) {
    name += std::string("/slurm-") + job;
    if (const char* task = std::getenv("SLURM_ARRAY_TASK_ID")) name += std::string("_") + task;
  }
  return name.substr(0, 100);
}

GpuWorker::GpuWorker(GpuWorkerOptions options) : options_(std::move(options)) {
  if (options_.name.empty()) options_.name = DefaultWorkerName();
  if (options_.batch < 1) options_.batch = 1;
}

GpuWorker::~GpuWorker() = default;

GpuWorkerStats GpuWorker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void GpuWorker::Log(const std::string& line) const {
  if (options_.quiet) return;
  std::fprintf(stderr, "gpu-worker %s: %s\n", options_.name.c_str(), line.c_str());
  std::fflush(stderr);
}

void GpuWorker::Fail(const Status& st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fatal_.ok()) fatal_ = st;
  }
  stop_ = true;
  cv_.notify_all();
}

bool GpuWorker::SleepUnlessStopped(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return stop_.load(); });
  return !stop_.load();
}

bool GpuWorker::Held(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.count(lease_id) > 0;
}

void GpuWorker::Drop(const std::vector<std::string>& lease_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& id : lease_ids) held_.erase(id);
}

void GpuWorker::GiveBack(const std::vector<std::string>& lease_ids) {
  if (lease_ids.empty()) return;
  pb::RenewLeasesRequest req;
  for (const auto& id : lease_ids) req.add_lease_ids(id);
  req.set_release(true);
  (void)client_->RenewLeases(req);  // failing that, the leases expire
  Drop(lease_ids);
}

int GpuWorker::Stop() {
  std::vector<std::string> ids;
  Client* client = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    ids.assign(held_.begin(), held_.end());
    client = client_.get();  // set under mu_ by Run(); lives as long as the worker
  }
  cv_.notify_all();
  if (ids.empty() || !client) return 0;
  pb::RenewLeasesRequest req;
  for (const auto& id : ids) req.add_lease_ids(id);
  req.set_release(true);
  auto r = client->RenewLeases(req);
  if (!r.ok()) Log("could not give the leases back (they expire on their own): " + r.status().ToString());
  Drop(ids);
  return r.ok() ? static_cast<int>(ids.size()) : 0;
}

void GpuWorker::RenewLoop() {
  for (;;) {
    double every;
    std::vector<std::string> ids;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Every third of the shortest lease held (practice calls' are short).
      double shortest = lease_s_;
      if (practice_lease_s_ > 0 && (shortest <= 0 || practice_lease_s_ < shortest)) shortest = practice_lease_s_;
      every = shortest > 0 ? shortest / 3 : 1.0;
      renew_now_ = false;
      if (cv_.wait_for(lock, std::chrono::duration<double>(every), [&] { return stop_.load() || renew_now_; })) {
        if (stop_) return;
      }
      ids.assign(held_.begin(), held_.end());
    }
    if (ids.empty()) continue;
    pb::RenewLeasesRequest req;
    for (const auto& id : ids) req.add_lease_ids(id);
    req.set_lease_seconds(options_.lease_s);
    auto r = client_->RenewLeases(req);
    if (!r.ok()) {
      Log("renewing leases: " + r.status().ToString());
      continue;
    }
    if (r->lost_size() > 0) {
      Log("lost " + std::to_string(r->lost_size()) + " lease(s): their results will not be reported");
      Drop({r->lost().begin(), r->lost().end()});
    }
  }
}

void GpuWorker::ServeDevice(int device) {
  LoadedProblem loaded;    // one problem's evaluators at a time per GPU: its reference holds GPU memory
  std::string facts_json;  // what this GPU measured, sent with the next report
  auto idle_since = Clock::now();
  double backoff = 0.5;
  const std::string who = options_.name + "/gpu" + std::to_string(device);

  while (!stop_) {
    pb::LeaseCandidatesRequest req;
    req.set_worker(who);
    req.set_max_candidates(options_.batch);
    req.set_lease_seconds(options_.lease_s);
    req.set_serves_practice(true);
    req.set_reads_counters(reads_counters_);
    if (loaded.evaluators) req.set_prefer_problem_id(loaded.problem_id);
    auto resp = client_->LeaseCandidates(req);
    if (!resp.ok()) {
      if (!Transient(resp.status())) return Fail(resp.status().WithContext("leasing from " + options_.client.address));
      Log("leasing: " + resp.status().ToString() + "; retrying in " + std::to_string(backoff) + " s");
      SleepUnlessStopped(backoff);
      backoff = std::min(backoff * 2, 30.0);
      continue;
    }
    backoff = 0.5;
    if (resp->candidates().empty() && resp->practice_calls().empty()) {
      if (options_.exit_when_idle_s > 0 && Since(idle_since) >= options_.exit_when_idle_s) return;
      SleepUnlessStopped(options_.idle_poll_s);
      continue;
    }
    Hold(*resp);
    // Stopped while the lease call was in flight: give them back at once.
    if (stop_) {
      std::vector<std::string> ids;
      for (const auto& c : resp->candidates()) ids.push_back(c.lease_id());
      for (const auto& c : resp->practice_calls()) ids.push_back(c.lease_id());
      GiveBack(ids);
      return;
    }
    // An agent's conversation waits on each practice call: they go first.
    ServePractice(device, *resp, &loaded, &facts_json);
    JudgeCandidates(device, *resp, &loaded, &facts_json);
    idle_since = Clock::now();
  }
}

void GpuWorker::Hold(const pb::LeaseCandidatesResponse& resp) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : resp.candidates()) held_.insert(c.lease_id());
    for (const auto& c : resp.practice_calls()) held_.insert(c.lease_id());
    stats_.leased += resp.candidates_size();
    lease_s_ = resp.lease_seconds();
    if (!resp.practice_calls().empty() && practice_lease_s_ != resp.practice_lease_seconds()) {
      practice_lease_s_ = resp.practice_lease_seconds();
      renew_now_ = true;  // the renewer's period follows the shortest lease held
    }
  }
  cv_.notify_all();
}

Status GpuWorker::Load(int device, const std::string& problem_id, const pb::LeasedProblem& problem,
                       Contract precision, bool practice, LoadedProblem* loaded, std::string* facts_json) {
  if (loaded->evaluators && loaded->sha == problem.sha256() && loaded->precision == precision &&
      (!practice || loaded->evaluators->practice()))
    return Status::Ok();
  // Made again with the practice evaluator when a practice call first asks
  // for it: its sets live inside the judging reference (one memory budget).
  loaded->evaluators.reset();
  store::ProblemRow row;
  row.name = problem.name();
  row.source = problem.source();
  EvaluatorOptions eo = options_.evaluator;
  eo.device = device;
  eo.gpus.clear();
  eo.precision = precision;
  std::optional<GpuFacts> facts;
  std::vector<std::string> degenerate;
  if (practice) Log("preparing " + row.name + " with the agents' practice sets on GPU " + std::to_string(device));
  std::unique_lock<std::shared_mutex> preparing(prepare_mu_);
  auto made = StoredProblemEvaluators::Make(row, eo, practice, &facts, &degenerate);
  preparing.unlock();
  if (!made.ok()) return made.status().WithContext("preparing problem " + problem_id + " (" + row.name + ")");
  loaded->evaluators = std::move(made).value();
  if (loaded->evaluators->judge()->CanReadCounters()) reads_counters_ = true;
  loaded->sha = problem.sha256();
  loaded->precision = precision;
  loaded->problem_id = problem_id;
  SearchConfig strict;  // the refusal as the CLI words it, for searches that do not allow it
  Status judge = CheckReferenceCanJudge(row.name, degenerate, strict);
  loaded->refusal = judge.ok() ? "" : std::string(kReferenceRefusal) + judge.message();
  if (facts) *facts_json = GpuFactsToJson(*facts).dump();
  return Status::Ok();
}

void GpuWorker::JudgeCandidates(int device, const pb::LeaseCandidatesResponse& resp, LoadedProblem* loaded,
                                std::string* facts_json) {
  const std::string who = options_.name + "/gpu" + std::to_string(device);
  // One evaluator per problem and precision contract (a search's --precision).
  std::map<std::pair<std::string, Contract>, std::vector<const pb::LeasedCandidate*>> by_problem;
  for (const auto& c : resp.candidates()) {
    auto contract = LeasedContract(c.precision());
    if (!contract.ok()) {
      Log(contract.status().ToString() + "; giving the lease back");
      GiveBack({c.lease_id()});
      continue;
    }
    by_problem[{c.problem_id(), *contract}].push_back(&c);
  }
  for (const auto& [key, cands] : by_problem) {
    const auto& [problem_id, precision] = key;
    std::vector<std::string> ids;
    for (const auto* c : cands) ids.push_back(c->lease_id());
    auto p = resp.problems().find(problem_id);
    if (p == resp.problems().end()) {
      Log("the server sent no source for problem " + problem_id + "; giving the leases back");
      GiveBack(ids);
      continue;
    }
    if (Status st = Load(device, problem_id, p->second, precision, /*practice=*/false, loaded, facts_json);
        !st.ok()) {
      Log(st.ToString() + "; giving the leases back");
      GiveBack(ids);
      SleepUnlessStopped(options_.idle_poll_s);
      continue;
    }
    CandidateEvaluator* evaluator = loaded->evaluators->judge();
    // Candidates whose search does not allow a degenerate reference are
    // refused (the server fails their search); the others are judged.
    std::vector<const pb::LeasedCandidate*> judged, refused;
    std::vector<Candidate> batch;
    for (const auto* c : cands) {
      if (!loaded->refusal.empty() && !c->allow_degenerate()) {
        refused.push_back(c);
      } else {
        judged.push_back(c);
        batch.push_back(Candidate{c->source(), c->plan_json()});
      }
    }
    for (const auto* c : refused) {
      if (stop_) return;
      pb::ReportEvaluationRequest rep;
      rep.set_reference_refusal(loaded->refusal);
      Report(who, c, rep);
    }
    if (batch.empty()) continue;
    std::shared_lock<std::shared_mutex> timing(prepare_mu_, std::defer_lock);
    if (device == 0) timing.lock();
    auto results = evaluator->EvaluateBatch(batch);
    if (timing.owns_lock()) timing.unlock();
    if (!results.ok() || results->size() != batch.size()) {
      Log("evaluator on GPU " + std::to_string(device) + ": " +
          (results.ok() ? std::string("wrong result count") : results.status().ToString()) +
          "; giving the leases back");
      loaded->evaluators.reset();  // made again for the next candidates (a worker that broke)
      std::vector<std::string> judged_ids;
      for (const auto* c : judged) judged_ids.push_back(c->lease_id());
      GiveBack(judged_ids);
      continue;
    }
    std::vector<const pb::LeasedCandidate*> profile;  // the server asked for their counters
    std::vector<Candidate> profile_batch;
    for (size_t i = 0; i < judged.size(); ++i) {
      if (stop_) return;  // Stop() gave the rest back
      pb::ReportEvaluationRequest rep;
      rep.set_evaluation_json(EvaluationToJson((*results)[i]).dump());
      rep.set_gpu_facts_json(*facts_json);
      auto answer = Report(who, judged[i], rep);
      if (answer) facts_json->clear();
      if (answer && answer->read_counters()) {
        profile.push_back(judged[i]);
        profile_batch.push_back(batch[i]);
      }
    }
    if (!profile.empty()) SendCounters(device, evaluator, profile, profile_batch);
  }
}

void GpuWorker::ServePractice(int device, const pb::LeaseCandidatesResponse& resp, LoadedProblem* loaded,
                              std::string* facts_json) {
  for (const pb::LeasedPracticeCall& call : resp.practice_calls()) {
    if (stop_) return;  // Stop() gave the rest back
    pb::ReportPracticeRequest rep;
    auto p = resp.problems().find(call.problem_id());
    const StatusOr<Contract> precision = LeasedContract(call.precision());
    Status ready = p == resp.problems().end()
                       ? Internal("the server sent no source for problem " + call.problem_id())
                   : !precision.ok()
                       ? precision.status()
                       : Load(device, call.problem_id(), p->second, *precision, /*practice=*/true, loaded, facts_json);
    if (!ready.ok()) {
      // The problem's practice evaluator cannot be made here: the agent is told why.
      Log("practice call " + call.id() + ": " + ready.ToString());
      rep.set_error(ready.message());
    } else {
      StatusOr<std::string> result = RunPractice(device, loaded->evaluators->practice(), call);
      if (!result.ok()) {
        Log("practice call " + call.id() + " (" + call.tool() + ") on GPU " + std::to_string(device) + ": " +
            result.status().ToString() + "; giving the lease back");
        loaded->evaluators.reset();  // made again for the next call (a worker that broke)
        GiveBack({call.lease_id()});
        continue;
      }
      rep.set_result_json(std::move(result).value());
    }
    ReportPractice(call, rep);
  }
}

StatusOr<std::string> GpuWorker::RunPractice(int device, CandidateEvaluator* evaluator,
                                             const pb::LeasedPracticeCall& call) {
  KS_ASSIGN_OR_RETURN(store::PracticeTool tool, store::ParsePracticeTool(call.tool()));
  const Candidate c{call.source(), call.plan_json()};
  std::shared_lock<std::shared_mutex> timing(prepare_mu_, std::defer_lock);
  if (device == 0) timing.lock();  // never beside the reference bridge on device 0
  switch (tool) {
    case store::PracticeTool::kCompile: {
      KS_ASSIGN_OR_RETURN(Evaluation e, evaluator->CompileOnly(c));
      return EvaluationToJson(e).dump();
    }
    case store::PracticeTool::kTest: {
      KS_ASSIGN_OR_RETURN(std::vector<Evaluation> out, evaluator->EvaluateBatch({c}));
      if (out.size() != 1) return Internal("the practice evaluator returned " + std::to_string(out.size()) + " results");
      return EvaluationToJson(out.front()).dump();
    }
    case store::PracticeTool::kProfile: {
      std::vector<CounterReport> out = evaluator->ReadCounters({c});
      if (out.size() != 1) return Internal("the practice evaluator returned " + std::to_string(out.size()) + " reports");
      return CounterReportToJson(out.front()).dump();
    }
  }
  return Internal("unreachable");
}

void GpuWorker::ReportPractice(const pb::LeasedPracticeCall& call, pb::ReportPracticeRequest& rep) {
  if (!Held(call.lease_id())) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.lost;
    return;
  }
  rep.set_id(call.id());
  rep.set_lease_id(call.lease_id());
  auto r = client_->ReportPractice(rep);
  for (double wait = 0.5; !r.ok() && Transient(r.status()) && wait <= 8 && !stop_; wait *= 2) {
    SleepUnlessStopped(wait);
    r = client_->ReportPractice(rep);
  }
  Drop({call.lease_id()});
  if (!r.ok()) Log("practice call " + call.id() + " not stored: " + r.status().ToString());
  std::lock_guard<std::mutex> lock(mu_);
  ++(r.ok() ? stats_.practice : stats_.lost);
}

void GpuWorker::SendCounters(int device, CandidateEvaluator* evaluator,
                             const std::vector<const pb::LeasedCandidate*>& cands, const std::vector<Candidate>& batch) {
  std::shared_lock<std::shared_mutex> timing(prepare_mu_, std::defer_lock);
  if (device == 0) timing.lock();
  std::vector<CounterReport> reports = evaluator->ReadCounters(batch);
  if (timing.owns_lock()) timing.unlock();
  for (size_t i = 0; i < cands.size() && i < reports.size(); ++i) {
    if (stop_) return;
    pb::ReportCountersRequest req;
    req.set_candidate_id(cands[i]->candidate_id());
    req.set_counters_json(CounterReportToJson(reports[i]).dump());
    auto r = client_->ReportCounters(req);
    if (!r.ok())
      Log("the counters of candidate " + cands[i]->candidate_id() + " were not stored: " + r.status().ToString());
  }
}

std::optional<pb::ReportEvaluationResponse> GpuWorker::Report(const std::string& who, const pb::LeasedCandidate* c,
                                                              pb::ReportEvaluationRequest& rep) {
  if (!Held(c->lease_id())) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.lost;
    return std::nullopt;
  }
  rep.set_candidate_id(c->candidate_id());
  rep.set_lease_id(c->lease_id());
  // A server that is briefly away gets the result a little later; the
  // renewer keeps the lease meanwhile.
  auto r = client_->ReportEvaluation(rep);
  for (double wait = 0.5; !r.ok() && Transient(r.status()) && wait <= 8 && !stop_; wait *= 2) {
    SleepUnlessStopped(wait);
    r = client_->ReportEvaluation(rep);
  }
  Drop({c->lease_id()});
  std::lock_guard<std::mutex> lock(mu_);
  if (!r.ok()) {
    ++stats_.lost;
    if (!options_.quiet)
      std::fprintf(stderr, "gpu-worker %s: candidate %s not stored: %s\n", who.c_str(), c->candidate_id().c_str(),
                   r.status().ToString().c_str());
    return std::nullopt;
  }
  ++stats_.reported;
  return *r;
}

Status GpuWorker::Run() {
  {
    KS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options_.client));
    std::lock_guard<std::mutex> lock(mu_);
    client_ = std::move(client);
  }
  if (options_.devices.empty()) return InvalidArgument("gpu-worker: no GPU to evaluate on");
  reads_counters_ = ReadsCountersUpFront(options_.evaluator);
  Log("serving " + std::to_string(options_.devices.size()) + " GPU(s) for " + options_.client.address);
  std::thread renewer([this] { RenewLoop(); });
  std::vector<std::thread> devices;
  for (int d : options_.devices) devices.emplace_back([this, d] { ServeDevice(d); });
  for (auto& t : devices) t.join();
  stop_ = true;
  cv_.notify_all();
  renewer.join();
  std::lock_guard<std::mutex> lock(mu_);
  Log("done: leased " + std::to_string(stats_.leased) + ", reported " + std::to_string(stats_.reported) +
      ", practice calls " + std::to_string(stats_.practice) + ", lost " + std::to_string(stats_.lost));
  return fatal_;
}

}  // namespace ks::server
