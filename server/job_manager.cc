#include "server/job_manager.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "server/convert.h"

namespace ks::server {

JobManager::JobManager(store::LineageStore* store, SearchRunner* runner, int pool_size, int max_queued)
    : store_(store), runner_(runner), pool_size_(std::max(1, pool_size)), max_queued_(std::max(0, max_queued)) {}

JobManager::~JobManager() { Shutdown(); }

void JobManager::SetProgressListener(std::function<void(int64_t)> listener) { listener_ = std::move(listener); }

void JobManager::Notify(int64_t search_id) {
  if (listener_) listener_(search_id);
}

StatusOr<int> JobManager::Start() {
  KS_ASSIGN_OR_RETURN(std::vector<store::SearchSummary> all, store_->History(0));
  std::vector<int64_t> resume;
  for (const auto& s : all) {
    if (s.search.status == store::SearchStatus::kPending || s.search.status == store::SearchStatus::kRunning)
      resume.push_back(s.search.id);
  }
  std::sort(resume.begin(), resume.end());
  std::lock_guard<std::mutex> lock(mu_);
  KS_CHECK(!started_);
  started_ = true;
  // Resumed searches bypass the queue bound: they were accepted before.
  for (int64_t id : resume) {
    auto job = std::make_shared<Job>();
    job->search_id = id;
    queue_.push_back(std::move(job));
  }
  for (int i = 0; i < pool_size_; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  return static_cast<int>(resume.size());
}

StatusOr<int64_t> JobManager::Submit(int64_t problem_id, const std::string& config_json) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return FailedPrecondition("the server is shutting down");
    if (static_cast<int>(queue_.size()) >= max_queued_)
      return ResourceExhausted("the search queue is full (" + std::to_string(max_queued_) +
                               " waiting); try again later");
  }
  // Created outside the lock (a store write); the bound above may be passed by
  // the few submits racing with it, which is harmless.
  KS_ASSIGN_OR_RETURN(int64_t id, store_->CreateSearch(problem_id, config_json));
  auto job = std::make_shared<Job>();
  job->search_id = id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return id;  // pending in the store: the next server runs it
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return id;
}

Status JobManager::Queue(int64_t search_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return FailedPrecondition("the server is shutting down");
    if (running_.count(search_id) ||
        std::any_of(queue_.begin(), queue_.end(), [&](const auto& j) { return j->search_id == search_id; }))
      return FailedPrecondition("search " + std::to_string(search_id) + " is already queued or running");
    if (static_cast<int>(queue_.size()) >= max_queued_)
      return ResourceExhausted("the search queue is full (" + std::to_string(max_queued_) +
                               " waiting); try again later");
    auto job = std::make_shared<Job>();
    job->search_id = search_id;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return Status::Ok();
}

Status JobManager::Cancel(int64_t search_id) {
  KS_ASSIGN_OR_RETURN(store::SearchRow row, store_->GetSearch(search_id));
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const auto& j) { return j->search_id == search_id; });
    if (it != queue_.end()) {
      queue_.erase(it);
    } else if (auto r = running_.find(search_id); r != running_.end()) {
      // The runner records the end itself, a moment before its job returns:
      // a search that already ended is not cancelled after the fact.
      if (IsTerminal(row.status))
        return FailedPrecondition("search " + std::to_string(search_id) + " already ended (" +
                                  store::SearchStatusName(row.status) + ")");
      r->second->cancel_requested = true;
      r->second->stop = true;
      // Answer once it has stopped (RunJob marks it cancelled when the runner
      // returns): the caller is told what happened, not that it may happen.
      // Model calls in flight are aborted; an evaluation batch in flight
      // finishes and is stored. Bounded, so that a stuck runner cannot hang the RPC.
      ended_cv_.wait_for(lock, std::chrono::seconds(60),
                         [&] { return running_.find(search_id) == running_.end(); });
      return Status::Ok();
    } else if (row.status == store::SearchStatus::kPending || row.status == store::SearchStatus::kRunning) {
      return FailedPrecondition("search " + std::to_string(search_id) + " is " +
                                store::SearchStatusName(row.status) + " but not run by this server");
    } else {
      return FailedPrecondition("search " + std::to_string(search_id) + " already ended (" +
                                store::SearchStatusName(row.status) + ")");
    }
  }
  KS_RETURN_IF_ERROR(store_->SetSearchStatus(search_id, store::SearchStatus::kCancelled, "cancelled"));
  Notify(search_id);
  return Status::Ok();
}

void JobManager::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutting_down_ || !queue_.empty(); });
      if (shutting_down_) return;
      job = queue_.front();
      queue_.pop_front();
      running_[job->search_id] = job;
    }
    RunJob(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_.erase(job->search_id);
    }
    ended_cv_.notify_all();
  }
}

void JobManager::RunJob(const std::shared_ptr<Job>& job) {
  const int64_t id = job->search_id;
  Status st = store_->SetSearchStatus(id, store::SearchStatus::kRunning, "");
  Notify(id);
  if (st.ok()) st = runner_->Run(id, &job->stop, [this, id] { Notify(id); });

  bool cancelled;
  bool shutting_down;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled = job->cancel_requested;
    shutting_down = shutting_down_;
  }
  auto row = store_->GetSearch(id);
  store::SearchStatus now = row.ok() ? row->status : store::SearchStatus::kRunning;
  Status mark;
  if (cancelled && !(now == store::SearchStatus::kFinished || now == store::SearchStatus::kFailed)) {
    mark = store_->SetSearchStatus(id, store::SearchStatus::kCancelled, "cancelled");
  } else if (shutting_down && now != store::SearchStatus::kFinished && now != store::SearchStatus::kFailed) {
    // Interrupted, not ended (the runner may have called our stop a cancel):
    // pending again, so that the next server resumes it.
    mark = store_->SetSearchStatus(id, store::SearchStatus::kPending, "interrupted by server shutdown");
  } else if (!st.ok()) {
    // A runner that recorded the failure itself (a reference that cannot
    // judge kernels) keeps its reason, which says what to do.
    if (now != store::SearchStatus::kFailed)
      mark = store_->SetSearchStatus(id, store::SearchStatus::kFailed, st.ToString());
  } else if (!IsTerminal(now)) {
    mark = store_->SetSearchStatus(id, store::SearchStatus::kFinished, row.ok() ? row->stop_reason : "");
  }
  if (!mark.ok())
    std::fprintf(stderr, "kernelsearch serve: search %lld: recording its state: %s\n", static_cast<long long>(id),
                 mark.ToString().c_str());
  Notify(id);
}

void JobManager::RequestStop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    for (auto& [id, job] : running_) job->stop = true;
  }
  cv_.notify_all();
}

void JobManager::Shutdown() {
  RequestStop();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
  // Queued searches stay pending in the store; the next server picks them up.
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
}

int JobManager::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(running_.size());
}

int JobManager::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

}  // namespace ks::server
