#include "server/watch_hub.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "server/convert.h"

namespace ks::server {

struct WatchHub::Reading {
  store::SearchSummary summary;
  std::vector<store::IdeaRow> ideas;
  bool has_candidates = false;
  std::vector<store::CandidateRow> candidates;  // evaluated ones, by id
  std::optional<store::CandidateRow> best;
};

WatchHub::WatchHub(store::LineageStore* store, int max_watchers, std::chrono::milliseconds poll_interval)
    : store_(store), max_watchers_(max_watchers), poll_interval_(poll_interval) {}

WatchHub::~WatchHub() { Stop(); }

void WatchHub::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  KS_CHECK(!poller_.joinable());
  poller_ = std::thread([this] { PollLoop(); });
}

void WatchHub::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (poller_.joinable()) poller_.join();
}

int WatchHub::watchers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(counted_.size());
}

void WatchHub::Poke(int64_t search_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!trackers_.count(search_id)) return;
    poked_.insert(search_id);
  }
  cv_.notify_all();
}

StatusOr<WatchHub::Reading> WatchHub::Read(int64_t search_id, bool with_candidates) {
  Reading r;
  // The summary first: when it says the search ended, everything it did is
  // already in the store, so the rows read next are complete.
  KS_ASSIGN_OR_RETURN(r.summary, store_->Summarize(search_id));
  KS_ASSIGN_OR_RETURN(r.ideas, store_->ListIdeas(search_id));
  if (with_candidates) {
    KS_ASSIGN_OR_RETURN(std::vector<store::CandidateRow> all, store_->ListCandidates(search_id));
    for (auto& c : all) {
      if (c.evaluated && c.evaluation) r.candidates.push_back(std::move(c));
    }
    r.has_candidates = true;
  }
  if (r.summary.search.best_candidate) {
    auto best = store_->GetCandidate(*r.summary.search.best_candidate);
    if (best.ok()) r.best = std::move(best).value();
  } else if (r.has_candidates) {
    for (const auto& c : r.candidates) {
      if (c.evaluation->status != EvalStatus::kCorrect || !c.evaluation->median_ms) continue;
      if (!r.best || *c.evaluation->median_ms < *r.best->evaluation->median_ms) r.best = c;
    }
  }
  return r;
}

void WatchHub::Apply(Tracker* t, const Reading& r, bool baseline) {
  std::vector<pb::SearchEvent> events;
  auto add = [&]() -> pb::SearchEvent* {
    events.emplace_back();
    return &events.back();
  };
  // The store counts rounds started; rounds are numbered from 0.
  for (int n = t->rounds + 1; n <= r.summary.rounds; ++n) add()->mutable_round_started()->set_round(n - 1);
  t->rounds = std::max(t->rounds, r.summary.rounds);
  for (const auto& idea : r.ideas) {
    if (!t->ideas.insert(idea.id).second) continue;
    pb::IdeaProposed* e = add()->mutable_idea_proposed();
    e->set_idea_id(IdToString(idea.id));
    e->set_round(idea.round);
    if (idea.parent_candidate) e->set_parent_id(IdToString(*idea.parent_candidate));
    e->set_text(idea.text);
  }
  if (r.has_candidates) {
    for (const auto& c : r.candidates) {
      if (!t->evaluated.insert(c.id).second) continue;
      FillCandidateSummary(c, add()->mutable_candidate_evaluated());
    }
  }
  if (r.best && r.best->id != t->best) {
    t->best = r.best->id;
    FillCandidateSummary(*r.best, add()->mutable_new_best());
  }
  t->info.Clear();
  FillSearchInfo(r.summary, &t->info);
  bool ended = IsTerminal(r.summary.search.status);
  if (ended) *add()->mutable_finished() = t->info;
  if (baseline) return;  // the snapshot stands for all of it
  for (size_t i = 0; i < events.size(); ++i) {
    events[i].set_sequence(++t->sequence);
    bool last = ended && i + 1 == events.size();
    for (const auto& ch : t->channels) ch->Deliver(events[i], last);
  }
  if (ended) {
    t->ended = true;
    t->removed = true;
    t->channels.clear();
  }
}

Status WatchHub::Subscribe(int64_t search_id, const std::shared_ptr<WatchChannel>& channel) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Unavailable("the server is shutting down");
    if (static_cast<int>(counted_.size()) >= max_watchers_)
      return ResourceExhausted("too many watchers (" + std::to_string(max_watchers_) + "); try again later");
  }
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::shared_ptr<Tracker> t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = trackers_.find(search_id); it != trackers_.end()) t = it->second;
    }
    if (!t) {
      KS_ASSIGN_OR_RETURN(Reading r, Read(search_id, /*with_candidates=*/true));
      if (IsTerminal(r.summary.search.status)) {
        // Ended: the snapshot and the finished event are the whole stream.
        pb::SearchEvent snap;
        FillSearchInfo(r.summary, snap.mutable_snapshot());
        pb::SearchEvent fin;
        fin.set_sequence(1);
        *fin.mutable_finished() = snap.snapshot();
        channel->Deliver(snap, false);
        channel->Deliver(fin, true);
        return Status::Ok();
      }
      auto fresh = std::make_shared<Tracker>();
      fresh->search_id = search_id;
      Apply(fresh.get(), r, /*baseline=*/true);
      std::lock_guard<std::mutex> lock(mu_);
      auto [it, inserted] = trackers_.emplace(search_id, fresh);
      t = it->second;  // another subscriber may have made one first: use it
    }
    std::lock_guard<std::mutex> tl(t->mu);
    if (t->removed) continue;  // raced with its removal; look again
    pb::SearchEvent snap;
    snap.set_sequence(t->sequence);
    *snap.mutable_snapshot() = t->info;
    channel->Deliver(snap, false);
    t->channels.push_back(channel);
    std::lock_guard<std::mutex> lock(mu_);  // t->mu then mu_: mu_ is never held while taking t->mu
    counted_.insert(channel.get());
    return Status::Ok();
  }
  return Internal("could not attach a watcher to search " + std::to_string(search_id));
}

void WatchHub::Unsubscribe(int64_t search_id, const WatchChannel* channel) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (counted_.erase(channel) == 0) return;
    removals_.emplace_back(search_id, channel);
    poked_.insert(search_id);
  }
  cv_.notify_all();
}

void WatchHub::Refresh(const std::shared_ptr<Tracker>& t) {
  size_t known;
  {
    std::lock_guard<std::mutex> tl(t->mu);
    if (t->removed) return;
    known = t->evaluated.size();
  }
  std::optional<Reading> reading;
  auto summary = store_->Summarize(t->search_id);
  if (summary.ok()) {
    // Listing candidates is the costly read; skip it while the count stands.
    auto r = Read(t->search_id, static_cast<size_t>(summary->evaluated) != known ||
                                     IsTerminal(summary->search.status));
    if (r.ok()) reading = std::move(r).value();
  }
  if (!reading) return;  // a busy or failing store: try again at the next poll
  std::lock_guard<std::mutex> tl(t->mu);
  if (t->removed) return;
  Apply(t.get(), *reading, /*baseline=*/false);
}

void WatchHub::PollLoop() {
  auto next_full = std::chrono::steady_clock::now() + poll_interval_;
  for (;;) {
    std::vector<std::shared_ptr<Tracker>> todo;
    std::vector<std::pair<int64_t, const WatchChannel*>> removals;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, next_full, [&] { return stopping_ || !poked_.empty(); });
      if (stopping_) break;
      bool full = std::chrono::steady_clock::now() >= next_full;
      if (full) next_full = std::chrono::steady_clock::now() + poll_interval_;
      for (auto& [id, t] : trackers_) {
        if (full || poked_.count(id)) todo.push_back(t);
      }
      poked_.clear();
      removals.swap(removals_);
    }
    // Detach watchers whose RPC ended; drop trackers nobody watches.
    std::vector<std::shared_ptr<Tracker>> idle;
    for (const auto& [id, ch] : removals) {
      std::shared_ptr<Tracker> t;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = trackers_.find(id); it != trackers_.end()) t = it->second;
      }
      if (!t) continue;
      std::lock_guard<std::mutex> tl(t->mu);
      std::erase_if(t->channels, [&](const auto& c) { return c.get() == ch; });
      if (t->channels.empty() && !t->removed) {
        t->removed = true;
        idle.push_back(t);
      }
    }
    for (const auto& t : todo) Refresh(t);
    for (const auto& t : todo) {
      std::lock_guard<std::mutex> tl(t->mu);
      if (t->ended) idle.push_back(t);
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& t : idle) {
      if (auto it = trackers_.find(t->search_id); it != trackers_.end() && it->second == t) trackers_.erase(it);
    }
  }
  // Stopping: every watcher hears that the stream ends here.
  std::map<int64_t, std::shared_ptr<Tracker>> trackers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    trackers.swap(trackers_);
  }
  for (auto& [id, t] : trackers) {
    std::lock_guard<std::mutex> tl(t->mu);
    t->removed = true;
    t->channels.clear();
  }
}

}  // namespace ks::server
