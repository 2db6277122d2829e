#include "search/evaluator_pool.h"

#include <algorithm>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "evaluator/cuda_driver.h"

namespace ks {

DeviceBoundEvaluator::~DeviceBoundEvaluator() {
  auto ctx = PrimaryContext::Open(device_);  // failing that, the driver is gone anyway
  inner_.reset();
}

StatusOr<std::vector<Evaluation>> DeviceBoundEvaluator::EvaluateBatch(const std::vector<Candidate>& candidates) {
  KS_ASSIGN_OR_RETURN(PrimaryContext ctx, PrimaryContext::Open(device_));
  return inner_->EvaluateBatch(candidates);
}

std::vector<CounterReport> DeviceBoundEvaluator::ReadCounters(const std::vector<Candidate>& candidates) {
  auto ctx = PrimaryContext::Open(device_);
  if (!ctx.ok()) return std::vector<CounterReport>(candidates.size(), CounterReport{{}, ctx.status().message(), 0});
  return inner_->ReadCounters(candidates);
}

StatusOr<std::vector<int>> ParseGpuList(const std::string& text, int device_count) {
  if (text == "all") {
    if (device_count == 0) return FailedPrecondition("--gpus all: no GPU on this machine");
    std::vector<int> all;
    for (int i = 0; i < std::max(1, device_count); ++i) all.push_back(i);
    return all;
  }
  std::vector<int> out;
  std::set<int> seen;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    bool digits = !item.empty() && item.size() <= 4 &&
                  std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) return InvalidArgument("--gpus: '" + item + "' is not a GPU ordinal (all, or a list such as 0,1)");
    int d = std::stoi(item);
    if (device_count >= 0 && d >= device_count)
      return InvalidArgument("--gpus: GPU " + item + " does not exist (this machine has " +
                             std::to_string(device_count) + ")");
    if (!seen.insert(d).second) return InvalidArgument("--gpus: GPU " + item + " named twice");
    out.push_back(d);
    pos = comma + 1;
  }
  return out;
}

EvaluatorPool::EvaluatorPool(std::vector<std::unique_ptr<CandidateEvaluator>> members,
                             std::vector<std::string> labels) {
  KS_CHECK(!members.empty());
  for (size_t i = 0; i < members.size(); ++i) {
    KS_CHECK(members[i] != nullptr);
    Member m;
    m.evaluator = std::move(members[i]);
    m.label = i < labels.size() ? labels[i] : "member " + std::to_string(i);
    members_.push_back(std::move(m));
  }
}

std::string EvaluatorPool::DeviceName() const { return members_.front().evaluator->DeviceName(); }

size_t EvaluatorPool::healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(
      std::count_if(members_.begin(), members_.end(), [](const Member& m) { return !m.retired; }));
}

std::vector<int64_t> EvaluatorPool::evaluated_per_member() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  for (const auto& m : members_) out.push_back(m.evaluated);
  return out;
}

int EvaluatorPool::Acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    bool any_alive = false;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].retired) continue;
      any_alive = true;
      if (!members_[i].busy) {
        members_[i].busy = true;
        return static_cast<int>(i);
      }
    }
    if (!any_alive) return -1;
    free_cv_.wait(lock);
  }
}

void EvaluatorPool::Release(int index, bool retire, int64_t evaluated) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Member& m = members_[static_cast<size_t>(index)];
    m.busy = false;
    m.retired = m.retired || retire;
    m.evaluated += evaluated;
  }
  free_cv_.notify_all();
}

std::vector<CounterReport> EvaluatorPool::ReadCounters(const std::vector<Candidate>& candidates) {
  int m = Acquire();
  if (m < 0) return std::vector<CounterReport>(candidates.size(), CounterReport{{}, "every evaluator of the pool is retired", 0});
  auto out = members_[static_cast<size_t>(m)].evaluator->ReadCounters(candidates);
  Release(m, /*retire=*/false, 0);
  return out;
}

StatusOr<std::vector<Evaluation>> EvaluatorPool::EvaluateBatch(const std::vector<Candidate>& candidates) {
  using Chunk = std::pair<size_t, size_t>;  // [begin, end)
  std::vector<std::optional<Evaluation>> results(candidates.size());
  std::mutex work_mu;  // guards next, given_back, last_error
  size_t next = 0;
  std::vector<Chunk> given_back;  // chunks of retired members, served first
  Status last_error = Unavailable("every evaluator of the pool is retired");
  const size_t n = members_.size();

  auto take = [&]() -> std::optional<Chunk> {
    std::lock_guard<std::mutex> lock(work_mu);
    if (!given_back.empty()) {
      Chunk c = given_back.back();
      given_back.pop_back();
      return c;
    }
    if (next >= candidates.size()) return std::nullopt;
    // One member takes the whole batch (its own compile pipeline sees all of it).
    size_t remaining = candidates.size() - next;
    size_t size = n == 1 ? remaining : std::max<size_t>(1, remaining / (2 * n));
    Chunk c{next, next + size};
    next += size;
    return c;
  };
  auto work_left = [&] {
    std::lock_guard<std::mutex> lock(work_mu);
    return !given_back.empty() || next < candidates.size();
  };
  auto serve = [&] {
    // A thread keeps its member while there is work; when its member fails it
    // gives the chunk back and tries another member.
    while (work_left()) {
      int m = Acquire();
      if (m < 0) return;
      Member& member = members_[static_cast<size_t>(m)];
      int64_t count = 0;
      bool retire = false;
      while (auto chunk = take()) {
        std::vector<Candidate> part(candidates.begin() + static_cast<std::ptrdiff_t>(chunk->first),
                                    candidates.begin() + static_cast<std::ptrdiff_t>(chunk->second));
        auto r = member.evaluator->EvaluateBatch(part);
        if (r.ok() && r->size() != part.size())
          r = Internal("returned " + std::to_string(r->size()) + " results for " + std::to_string(part.size()));
        if (!r.ok()) {
          retire = true;
          std::lock_guard<std::mutex> lock(work_mu);
          given_back.push_back(*chunk);
          last_error = r.status().WithContext(member.label);
          break;
        }
        for (size_t i = 0; i < part.size(); ++i) results[chunk->first + i] = std::move((*r)[i]);
        count += static_cast<int64_t>(part.size());
      }
      Release(m, retire, count);
      if (!retire) return;
    }
  };

  if (candidates.empty()) return std::vector<Evaluation>();
  std::vector<std::thread> threads;
  for (size_t i = 1; i < std::min(n, candidates.size()); ++i) threads.emplace_back(serve);
  serve();
  for (auto& t : threads) t.join();

  std::vector<Evaluation> out;
  out.reserve(candidates.size());
  for (auto& r : results) {
    if (!r) return last_error;
    out.push_back(std::move(*r));
  }
  return out;
}

StatusOr<std::unique_ptr<EvaluatorPool>> EvaluatorPool::Create(
    const std::vector<int>& devices,
    const std::function<StatusOr<std::unique_ptr<CandidateEvaluator>>(int device)>& make) {
  if (devices.empty()) return InvalidArgument("an evaluator pool needs at least one GPU");
  std::vector<std::optional<StatusOr<std::unique_ptr<CandidateEvaluator>>>> made(devices.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < devices.size(); ++i) threads.emplace_back([&, i] { made[i] = make(devices[i]); });
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<CandidateEvaluator>> members;
  std::vector<std::string> labels;
  for (size_t i = 0; i < devices.size(); ++i) {
    labels.push_back("gpu " + std::to_string(devices[i]));
    if (!made[i]->ok()) return made[i]->status().WithContext(labels.back());
    members.push_back(std::move(*made[i]).value());
  }
  return std::make_unique<EvaluatorPool>(std::move(members), std::move(labels));
}

}  // namespace ks
