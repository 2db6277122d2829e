// Fans a search's progress out to its watchers. One tracker per watched search
// diffs the lineage store (rounds, ideas, evaluated candidates, best, state)
// and turns each difference into a SearchEvent; because the events come from
// the store, a watcher sees the same story whether the search runs in this
// server, was resumed after a restart, or is written by another process.
//
// Threads: one poller thread (Start/Stop) refreshes trackers every
// poll_interval, or at once after Poke(search_id). Deliveries go to
// WatchChannels, which must not block (they queue and return).
// Ownership: borrows the store (must outlive the hub); shares each channel with
// its RPC, which calls Unsubscribe when the RPC ends.
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "proto/kernelsearch.pb.h"
#include "store/lineage_store.h"

namespace ks::server {

// One watcher's end. Deliver is called with events in sequence order, never
// concurrently for one channel; `last` says the stream is complete.
class WatchChannel {
 public:
  virtual ~WatchChannel() = default;
  virtual void Deliver(const ::kernelsearch::v1::SearchEvent& event, bool last) = 0;
};

class WatchHub {
 public:
  WatchHub(store::LineageStore* store, int max_watchers, std::chrono::milliseconds poll_interval);
  ~WatchHub();
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  void Start();
  void Stop();

  // Delivers the snapshot (and, for a search that already ended, the finished
  // event as the last one) before returning, then every later event.
  // NotFound for an unknown search; ResourceExhausted past max_watchers.
  Status Subscribe(int64_t search_id, const std::shared_ptr<WatchChannel>& channel);
  void Unsubscribe(int64_t search_id, const WatchChannel* channel);
  // Something changed in this search: refresh its tracker now.
  void Poke(int64_t search_id);

  int watchers() const;

 private:
  struct Tracker {
    int64_t search_id = 0;
    std::mutex mu;  // guards everything below; taken after mu_ when both are
    std::vector<std::shared_ptr<WatchChannel>> channels;
    int64_t sequence = 0;
    int rounds = 0;
    std::set<int64_t> ideas;
    std::set<int64_t> evaluated;
    int64_t best = 0;
    ::kernelsearch::v1::SearchInfo info;  // as of the last refresh
    bool ended = false;
    bool removed = false;  // out of trackers_: a subscriber must look again
  };
  // What one refresh read from the store (outside any lock).
  struct Reading;

  StatusOr<Reading> Read(int64_t search_id, bool with_candidates);
  // Applies a reading to a tracker: emits events (or only records the
  // baseline when `baseline`). Caller holds t->mu.
  void Apply(Tracker* t, const Reading& r, bool baseline);
  void Refresh(const std::shared_ptr<Tracker>& t);
  void PollLoop();

  store::LineageStore* const store_;
  const int max_watchers_;
  const std::chrono::milliseconds poll_interval_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::shared_ptr<Tracker>> trackers_;
  std::set<int64_t> poked_;
  // Channels counted against max_watchers_, and those whose RPC ended but that
  // a tracker still holds. Unsubscribe only touches these (never a tracker's
  // lock), so a channel may call it from inside Deliver without deadlock.
  std::set<const WatchChannel*> counted_;
  std::vector<std::pair<int64_t, const WatchChannel*>> removals_;
  bool stopping_ = false;
  std::thread poller_;
};

}  // namespace ks::server
