// Searches as jobs: a bounded queue in front of a fixed pool of threads, each
// running one search at a time through a SearchRunner. The lineage store is the
// job state (pending / running / finished / cancelled / failed), so a restarted
// server finds the searches that were pending or running and resumes them.
//
// Ownership: borrows the store and the runner; both must outlive the manager.
// Thread-safety: every public method may be called from any thread.
// Lifetime: Start() once; Shutdown() (also run by the destructor) stops taking
// work, asks running searches to stop, waits for them and leaves them pending
// in the store so that the next server resumes them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "store/lineage_store.h"
#include "server/search_runner.h"

namespace ks::server {

class JobManager {
 public:
  JobManager(store::LineageStore* store, SearchRunner* runner, int pool_size, int max_queued);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Queues every search the store holds as pending or running (oldest first),
  // then starts the pool. Returns how many searches were resumed.
  StatusOr<int> Start();

  // Creates the search in the store and queues it. ResourceExhausted when the
  // queue is full (nothing is stored then); FailedPrecondition after Shutdown.
  StatusOr<int64_t> Submit(int64_t problem_id, const std::string& config_json);

  // Queues a search the store already holds (a finished one given more rounds:
  // ContinueSearch). FailedPrecondition while it is queued or running here, or
  // after Shutdown; ResourceExhausted when the queue is full.
  Status Queue(int64_t search_id);

  // A queued search is marked cancelled at once; a running one is asked to stop
  // (no new model calls, calls in flight aborted) and marked cancelled when its
  // runner returns, which Cancel waits for (at most a minute: an evaluation
  // batch in flight finishes first). NotFound for an unknown id;
  // FailedPrecondition when it already ended or is not run by this server.
  Status Cancel(int64_t search_id);

  // Called with the search id whenever a search made progress or changed state.
  // Set before Start(); called from pool threads.
  void SetProgressListener(std::function<void(int64_t)> listener);

  // Stops taking work and asks running searches to stop; does not wait.
  void RequestStop();
  // RequestStop, then waits for the pool.
  void Shutdown();

  int running() const;
  int queued() const;

 private:
  struct Job {
    int64_t search_id = 0;
    std::atomic<bool> stop{false};
    bool cancel_requested = false;  // guarded by mu_
  };

  void WorkerLoop();
  void RunJob(const std::shared_ptr<Job>& job);
  void Notify(int64_t search_id);

  store::LineageStore* const store_;
  SearchRunner* const runner_;
  const int pool_size_;
  const int max_queued_;
  std::function<void(int64_t)> listener_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable ended_cv_;  // a running job ended (Cancel waits on it)
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<int64_t, std::shared_ptr<Job>> running_;
  bool started_ = false;
  bool shutting_down_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ks::server
