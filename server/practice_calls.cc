#include "server/practice_calls.h"

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "evaluator/profile/counters.h"
#include "evaluator/evaluation.h"

namespace ks::server {
namespace {

// What the agent's tools call (search/agent_run.cc): each method one practice
// call through the workers. Thread-safe: agents of one search run on several
// threads, and every call is an independent row that any worker may take.
class PracticeEvaluator final : public CandidateEvaluator {
 public:
  PracticeEvaluator(PracticeCalls* calls, int64_t search_id, const std::atomic<bool>* stop)
      : calls_(calls), search_id_(search_id), stop_(stop) {}

  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) override {
    std::vector<Evaluation> out;
    for (const Candidate& c : candidates) {
      KS_ASSIGN_OR_RETURN(Evaluation e, Run(store::PracticeTool::kTest, c));
      out.push_back(std::move(e));
    }
    return out;
  }

  StatusOr<Evaluation> CompileOnly(const Candidate& candidate) override {
    return Run(store::PracticeTool::kCompile, candidate);
  }

  std::vector<CounterReport> ReadCounters(const std::vector<Candidate>& candidates) override {
    std::vector<CounterReport> out;
    for (const Candidate& c : candidates) {
      auto r = calls_->Call(search_id_, store::PracticeTool::kProfile, c, stop_);
      if (!r.ok()) {
        out.push_back(CounterReport{{}, r.status().message(), 0});
        continue;
      }
      nlohmann::json j = nlohmann::json::parse(*r, nullptr, /*allow_exceptions=*/false);
      out.push_back(j.is_object() ? CounterReportFromJson(j)
                                  : CounterReport{{}, "the GPU worker's counters were not JSON", 0});
    }
    return out;
  }

  bool CanReadCounters() const override { return calls_->WorkersReadCounters(); }
  std::string DeviceName() const override { return "GPU workers"; }

 private:
  StatusOr<Evaluation> Run(store::PracticeTool tool, const Candidate& c) {
    KS_ASSIGN_OR_RETURN(std::string result, calls_->Call(search_id_, tool, c, stop_));
    nlohmann::json j = nlohmann::json::parse(result, nullptr, /*allow_exceptions=*/false);
    auto e = EvaluationFromJson(j);
    if (!e.ok()) return Internal("the stored result of a practice " + std::string(PracticeToolName(tool)) +
                                 " call is not an evaluation: " + e.status().message());
    return e;
  }

  PracticeCalls* const calls_;
  const int64_t search_id_;
  const std::atomic<bool>* const stop_;
};

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", std::round(s * 10) / 10);
  return buf;
}

}  // namespace

PracticeCalls::PracticeCalls(store::LineageStore* store, PracticeCallOptions options)
    : store_(store), options_(options) {}

std::unique_ptr<CandidateEvaluator> PracticeCalls::EvaluatorFor(int64_t search_id, const std::atomic<bool>* stop) {
  return std::make_unique<PracticeEvaluator>(this, search_id, stop);
}

void PracticeCalls::WorkerSeen(bool reads_counters) {
  if (!reads_counters) return;
  std::lock_guard<std::mutex> lock(mu_);
  counters_seen_ = Clock::now();
}

bool PracticeCalls::WorkersReadCounters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_seen_ != Clock::time_point{} &&
         Clock::now() - counters_seen_ < std::chrono::duration<double>(options_.worker_memory_s);
}

void PracticeCalls::Poke() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++pokes_;
  }
  cv_.notify_all();
}

StatusOr<std::string> PracticeCalls::Call(int64_t search_id, store::PracticeTool tool, const Candidate& candidate,
                                          const std::atomic<bool>* stop) {
  const std::string tool_name = store::PracticeToolName(tool);
  KS_ASSIGN_OR_RETURN(int64_t id, store_->PutPracticeCall(search_id, tool, candidate.source, candidate.plan_json));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options_.deadline_s));
  for (;;) {
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen = pokes_;
    }
    KS_ASSIGN_OR_RETURN(store::PracticeCallRow row, store_->GetPracticeCall(id));
    switch (row.state) {
      case store::PracticeCallState::kDone:
        return row.result_json;
      case store::PracticeCallState::kFailed:
        return FailedPrecondition("the " + tool_name + " call could not run on a GPU worker: " + row.error);
      case store::PracticeCallState::kAbandoned:  // another agent waiting for the same call gave up
        return DeadlineExceeded("no GPU worker answered the " + tool_name + " call in time");
      case store::PracticeCallState::kPending:
        break;
    }
    if (stop && stop->load()) {
      KS_RETURN_IF_ERROR(store_->AbandonPracticeCall(id));
      return Cancelled("the search is stopping; its " + tool_name + " call was dropped");
    }
    if (Clock::now() >= deadline) {
      KS_RETURN_IF_ERROR(store_->AbandonPracticeCall(id));
      return DeadlineExceeded("no GPU worker answered the " + tool_name + " call within " +
                              Seconds(options_.deadline_s) +
                              " s (is a `kernelsearch gpu-worker --server` connected to this server?)");
    }
    std::unique_lock<std::mutex> lock(mu_);
    auto until = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(options_.poll_s)));
    cv_.wait_until(lock, until, [&] { return pokes_ != seen; });
  }
}

}  // namespace ks::server
