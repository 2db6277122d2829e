// A counting semaphore whose wait can be cancelled, bounding the calls a backend
// has in flight. Thread-safe; shared by all calls of one client, which owns it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace ks {

using CancelFlags = std::vector<const std::atomic<bool>*>;  // borrowed; nulls ignored

inline bool AnyCancelled(const CancelFlags& flags) {
  for (const auto* f : flags)
    if (f && f->load()) return true;
  return false;
}

// Sleeps for `seconds` unless a flag becomes true first; false when cancelled.
// The flags are plain atomics nobody notifies, so it polls in short slices.
inline bool SleepUnlessCancelled(double seconds, const CancelFlags& flags) {
  using Clock = std::chrono::steady_clock;
  auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (Clock::now() < until) {
    if (AnyCancelled(flags)) return false;
    Clock::duration left = until - Clock::now();
    std::this_thread::sleep_for(std::min<Clock::duration>(left, std::chrono::milliseconds(20)));
  }
  return !AnyCancelled(flags);
}

class ConcurrencyLimiter {
 public:
  explicit ConcurrencyLimiter(int slots) : free_(slots > 0 ? slots : 1) {}
  ConcurrencyLimiter(const ConcurrencyLimiter&) = delete;
  ConcurrencyLimiter& operator=(const ConcurrencyLimiter&) = delete;

  // Holds one slot for its lifetime (when acquired() is true).
  class Slot {
   public:
    Slot(ConcurrencyLimiter* owner, const CancelFlags& flags) : owner_(owner) {
      std::unique_lock<std::mutex> lock(owner_->mu_);
      while (owner_->free_ == 0) {
        if (AnyCancelled(flags)) return;
        owner_->cv_.wait_for(lock, std::chrono::milliseconds(20));
      }
      --owner_->free_;
      acquired_ = true;
    }
    ~Slot() {
      if (!acquired_) return;
      {
        std::lock_guard<std::mutex> lock(owner_->mu_);
        ++owner_->free_;
      }
      owner_->cv_.notify_one();
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    bool acquired() const { return acquired_; }

   private:
    ConcurrencyLimiter* owner_;
    bool acquired_ = false;
  };

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
};

}  // namespace ks
