// The seam between the job manager and the search itself: "run this stored
// search to its end". The production implementation drives the orchestrator
// (server/orchestrator_runner.h); tests plug in fakes that write to the store.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "common/status.h"

namespace ks::server {

class SearchRunner {
 public:
  virtual ~SearchRunner() = default;

  // Runs search `search_id` (present in the store, pending or running, possibly
  // half done) to its end, resuming from what the store holds. Returns soon
  // after `*stop` turns true, leaving the store resumable. `progress` may be
  // called (from any thread, any number of times) when something was written,
  // so that watchers hear of it at once rather than at the next poll.
  // A returned error means the search failed; the job manager records it.
  // Thread-safe: the pool calls it for different searches at once.
  virtual Status Run(int64_t search_id, const std::atomic<bool>* stop, const std::function<void()>& progress) = 0;
};

}  // namespace ks::server
