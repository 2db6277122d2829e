#include "search/orchestrator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/files.h"
#include "search/kernel_bank.h"
#include "search/prompts.h"
#include "search/response_parser.h"
#include "store/candidate_hash.h"

namespace ks {

using store::CandidateKind;
using store::CandidateRow;
using store::IdeaRow;
using store::RoundRow;
using store::SearchStatus;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Timing noise: kernels within 2% of each other are tied, and the tie goes to a
// kernel from an idea the beam does not hold yet.
constexpr double kTieTolerance = 0.02;

bool Repairable(EvalStatus s) {
  return s == EvalStatus::kCompileError || s == EvalStatus::kInvalidPlan || s == EvalStatus::kLaunchError ||
         s == EvalStatus::kRuntimeError || s == EvalStatus::kIncorrect;
}

StatusOr<Evaluation> StoredEvaluation(const CandidateRow& c) {
  if (!c.evaluation) return Internal("candidate " + std::to_string(c.id) + " has no evaluation");
  nlohmann::json j = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  if (j.is_discarded()) return Internal("candidate " + std::to_string(c.id) + ": stored evaluation is not JSON");
  return EvaluationFromJson(j);
}

// A bounded pool of threads for model calls. Tasks may submit tasks. The owner
// waits with the run's condition variable (Outstanding() reaches 0 only when
// every task, including those submitted by tasks, has finished).
class TaskPool {
 public:
  TaskPool(int threads, std::mutex* mu, std::condition_variable* cv) : mu_(mu), cv_(cv) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~TaskPool() {
    {
      std::lock_guard<std::mutex> lock(*mu_);
      stop_ = true;
    }
    cv_->notify_all();
    for (auto& t : threads_) t.join();
  }
  // Call with *mu_ held.
  void SubmitLocked(std::function<void()> task) {
    queue_.push_back(std::move(task));
    ++outstanding_;
    cv_->notify_all();
  }
  int OutstandingLocked() const { return outstanding_; }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(*mu_);
    for (;;) {
      cv_->wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      --outstanding_;
      cv_->notify_all();
    }
  }
  std::mutex* mu_;
  std::condition_variable* cv_;
  std::deque<std::function<void()>> queue_;
  int outstanding_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

const char* SearchEventTypeName(SearchEvent::Type t) {
  switch (t) {
    case SearchEvent::Type::kRoundStarted: return "round_started";
    case SearchEvent::Type::kIdeaProposed: return "idea_proposed";
    case SearchEvent::Type::kCandidateGenerated: return "candidate_generated";
    case SearchEvent::Type::kCandidateEvaluated: return "candidate_evaluated";
    case SearchEvent::Type::kNewBest: return "new_best";
    case SearchEvent::Type::kLlmCall: return "llm_call";
    case SearchEvent::Type::kFinished: return "finished";
  }
  return "?";
}

nlohmann::json SearchEventToJson(const SearchEvent& e) {
  nlohmann::json j = {{"event", SearchEventTypeName(e.type)},
                      {"search", e.search_id},
                      {"round", e.round},
                      {"evaluated", e.evaluated},
                      {"failed", e.failed},
                      {"llm_calls", e.llm_calls},
                      {"tokens", e.tokens},
                      {"cost_usd", e.cost_usd}};
  if (e.idea_id) j["idea"] = e.idea_id;
  if (e.candidate_id) j["candidate"] = e.candidate_id;
  if (!e.text.empty()) j["text"] = e.text;
  if (!e.error.empty()) j["error"] = e.error;
  if (e.llm_failed) j["llm_failed"] = e.llm_failed;
  if (e.eval_status) j["status"] = EvalStatusName(*e.eval_status);
  if (e.speedup) j["speedup"] = *e.speedup;
  if (e.best_speedup) j["best_speedup"] = *e.best_speedup;
  if (e.reused) j["reused"] = true;
  if (e.type == SearchEvent::Type::kFinished) j["final_status"] = store::SearchStatusName(e.final_status);
  return j;
}

std::vector<int64_t> SelectBeam(const std::vector<store::CandidateRow>& correct, int beam_size, uint64_t seed) {
  // Exact ties go by a seeded hash of the content, not by id, so that two runs
  // of the same search (continuous or split) choose the same kernels.
  auto tie_key = [&](const CandidateRow& c) { return Sha256Hex(std::to_string(seed) + c.content_hash); };
  std::vector<std::pair<CandidateRow, std::string>> remaining;
  for (const auto& c : correct) {
    if (!c.evaluation || c.evaluation->status != EvalStatus::kCorrect || !c.evaluation->median_ms) continue;
    remaining.emplace_back(c, tie_key(c));
  }
  std::stable_sort(remaining.begin(), remaining.end(), [](const auto& a, const auto& b) {
    if (*a.first.evaluation->median_ms != *b.first.evaluation->median_ms)
      return *a.first.evaluation->median_ms < *b.first.evaluation->median_ms;
    return a.second < b.second;
  });
  std::vector<int64_t> beam;
  std::set<std::optional<int64_t>> ideas_in_beam;
  std::set<std::string> contents_in_beam;
  while (static_cast<int>(beam.size()) < beam_size && !remaining.empty()) {
    double fastest = *remaining.front().first.evaluation->median_ms;
    size_t pick = 0;
    for (size_t i = 0; i < remaining.size(); ++i) {
      if (*remaining[i].first.evaluation->median_ms > fastest * (1 + kTieTolerance)) break;
      if (!ideas_in_beam.count(remaining[i].first.idea_id)) {
        pick = i;
        break;
      }
    }
    CandidateRow chosen = remaining[pick].first;
    remaining.erase(remaining.begin() + pick);
    if (contents_in_beam.count(chosen.content_hash)) continue;  // the same kernel twice teaches nothing
    beam.push_back(chosen.id);
    ideas_in_beam.insert(chosen.idea_id);
    contents_in_beam.insert(chosen.content_hash);
  }
  return beam;
}

// One Run() or EvaluatePending() of one search: the state shared by the Run
// thread and the pool's tasks. mu_ guards every member marked (mu_).
class Orchestrator::SearchRun {
 public:
  SearchRun(Orchestrator* o, int64_t search_id) : o_(o), store_(o->deps_.store), search_id_(search_id) {}

  Status Load() {
    KS_ASSIGN_OR_RETURN(search_, store_->GetSearch(search_id_));
    prior_elapsed_s_ = search_.elapsed_s;
    KS_ASSIGN_OR_RETURN(store::ProblemRow problem, store_->GetProblem(search_.problem_id));
    nlohmann::json cj = nlohmann::json::parse(search_.config_json, nullptr, false);
    auto config = SearchConfigFromJson(cj);
    if (!config.ok()) return config.status().WithContext("search " + std::to_string(search_id_) + " config");
    config_ = std::move(config).value();
    problem_.name = problem.name;
    problem_.source = problem.source;
    nlohmann::json sj = nlohmann::json::parse(problem.signature_json, nullptr, false);
    if (sj.is_object() && !sj.empty()) {
      auto sig = SignatureFromJson(sj);
      if (!sig.ok()) return sig.status().WithContext("problem " + problem.name + " signature");
      problem_.signature = std::move(sig).value();
    }
    problem_.gpu = config_.gpu;
    KS_RETURN_IF_ERROR(LoadMeasuredFacts());
    if (config_.bank) {
      KS_ASSIGN_OR_RETURN(auto entries, store_->BankCandidates(search_.problem_id));
      bank_ = SelectBankKernels(problem_.source, entries);
    }
    KS_ASSIGN_OR_RETURN(store::LlmSpend spend, store_->Spend(search_id_));
    spend_ = spend;
    KS_ASSIGN_OR_RETURN(auto best, store_->BestCorrect(search_id_));
    if (best) {
      best_id_ = best->id;
      best_speedup_ = best->evaluation->speedup_eager;
    }
    KS_ASSIGN_OR_RETURN(auto summary, store_->Summarize(search_id_));
    evaluated_total_ = summary.evaluated;
    failed_total_ = summary.evaluated - summary.correct;
    return Status::Ok();
  }

  // The device facts a GPU node measured and stored (evaluate-pending, or an
  // evaluator of an earlier run) replace the ones fixed at creation when the
  // latter were not measured (a split search created with --gpu NAME before any
  // GPU node reported): first those recorded for this search, else the latest
  // for the GPU's name.
  Status LoadMeasuredFacts() {
    if (problem_.gpu.sm_count > 0 && problem_.gpu.memory_bandwidth_gbps > 0) return Status::Ok();
    KS_ASSIGN_OR_RETURN(auto facts, store_->LatestGpuFactsForSearch(search_id_));
    if (!facts && !problem_.gpu.name.empty()) {
      KS_ASSIGN_OR_RETURN(facts, store_->LatestGpuFacts(problem_.gpu.name));
    }
    if (!facts) return Status::Ok();
    nlohmann::json j = nlohmann::json::parse(*facts, nullptr, false);
    if (!j.is_object()) return Status::Ok();  // a foreign row: keep what the config says
    problem_.gpu = GpuFactsFromJson(j);
    return Status::Ok();
  }

  StatusOr<SearchOutcome> Run(Mode mode) {
    start_ = Clock::now();
    elapsed_mark_ = start_;
    if (!o_->deps_.llm || !o_->deps_.prompts) return FailedPrecondition("the search needs an LLM client and prompts");
    if (mode == Mode::kContinuous && !o_->deps_.evaluator)
      return FailedPrecondition("no evaluator: run with --generate-only, then evaluate-pending on a GPU node");
    KS_RETURN_IF_ERROR(Load());
    KS_RETURN_IF_ERROR(store_->SetSearchStatus(search_id_, SearchStatus::kRunning, ""));
    pool_ = std::make_unique<TaskPool>(config_.llm_concurrency, &mu_, &cv_);
    Status st = Loop(mode);
    pool_.reset();  // joins; tasks that were still queued run (and see the stop)
    if (!st.ok() && fatal_.ok()) fatal_ = st;
    return Finish();
  }

  StatusOr<SearchOutcome> EvaluateOnly() {
    start_ = Clock::now();
    elapsed_mark_ = start_;
    if (!o_->deps_.evaluator) return FailedPrecondition("evaluate-pending needs an evaluator");
    KS_RETURN_IF_ERROR(Load());
    auto n = EvaluateBatch();
    Status saved = SaveElapsed();
    if (!n.ok()) return n.status();
    KS_RETURN_IF_ERROR(saved);
    SearchOutcome out = Outcome();
    KS_ASSIGN_OR_RETURN(auto s, store_->GetSearch(search_id_));
    out.status = s.status;
    out.stop_reason = s.stop_reason;
    return out;
  }

 private:
  // ---- the round loop ----

  Status Loop(Mode mode) {
    for (;;) {
      if (Cancelled()) return Status::Ok();
      KS_ASSIGN_OR_RETURN(std::optional<RoundRow> last, store_->LastRound(search_id_));
      std::optional<RoundRow> round;
      if (last) {
        KS_ASSIGN_OR_RETURN(bool complete, RoundComplete(*last));
        if (!complete) round = last;
      }
      if (!round) {
        // Budgets and the target are checked here, between rounds; an unfinished
        // round is always processed first, so that what is pending gets evaluated.
        if (Stopping()) return Status::Ok();
        int next = last ? last->round + 1 : 0;
        if (next > config_.rounds) return Done("rounds");
        if (config_.target_speedup > 0 && BestSpeedup() && *BestSpeedup() >= config_.target_speedup)
          return Done(fmt::format("target speedup {:.2f}x reached", config_.target_speedup));
        KS_ASSIGN_OR_RETURN(std::vector<int64_t> beam, SelectBeam());
        KS_ASSIGN_OR_RETURN(RoundRow started, store_->StartRound(search_id_, next, beam));
        round = started;
        std::string text = beam.empty() ? (config_.seed_source.empty() || next > 0 ? "from the reference"
                                                                                    : "from the seed kernel")
                                        : "beam " + nlohmann::json(beam).dump();
        Emit({.type = SearchEvent::Type::kRoundStarted, .round = next, .text = text});
      }
      bool generated_something = false;
      KS_RETURN_IF_ERROR(ProcessRound(*round, mode, &generated_something));
      if (!fatal_.ok()) return fatal_;
      if (Stopping()) return Status::Ok();
      if (mode == Mode::kGenerateOnly) {
        KS_ASSIGN_OR_RETURN(auto pending, store_->PendingCandidates(search_id_));
        KS_ASSIGN_OR_RETURN(bool complete, RoundComplete(*round));
        if (!generated_something && complete) continue;  // nothing to do for this round: start the next
        generate_only_note_ = fmt::format("round {}: {} candidates pending evaluation", round->round, pending.size());
        return Status::Ok();
      }
    }
  }

  // A round is complete when its first pass was generated, nothing is pending
  // and no failed candidate still waits for a repair.
  StatusOr<bool> RoundComplete(const RoundRow& round) {
    if (!round.generated) return false;
    KS_ASSIGN_OR_RETURN(auto cands, store_->ListCandidates(search_id_));
    for (const auto& c : cands) {
      if (c.round != round.round) continue;
      if (!c.evaluated) return false;
      if (RepairEligible(c)) return false;
    }
    return true;
  }

  bool RepairEligible(const CandidateRow& c) const {
    return c.evaluated && c.evaluation && Repairable(c.evaluation->status) &&
           c.repair_depth < config_.repair_attempts && !c.repair_attempted;
  }

  Status ProcessRound(const RoundRow& round, Mode mode, bool* generated_something) {
    round_ = round.round;
    {
      std::lock_guard<std::mutex> lock(mu_);
      generated_count_ = 0;
      first_pass_interrupted_ = false;
    }
    if (!round.generated) KS_RETURN_IF_ERROR(SubmitFirstPass(round));
    KS_RETURN_IF_ERROR(SubmitRepairs());
    if (mode == Mode::kContinuous) {
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(mu_);
          auto wait_start = Clock::now();
          cv_.wait(lock, [&] {
            return pending_signal_ > 0 || pool_->OutstandingLocked() == 0 || !fatal_.ok() || Cancelled();
          });
          if (pending_signal_ == 0) llm_wait_s_ += Seconds(wait_start);
          pending_signal_ = 0;
          if (!fatal_.ok()) return fatal_;
        }
        if (Cancelled()) break;
        KS_ASSIGN_OR_RETURN(int64_t n, EvaluateBatch());
        if (n > 0) {
          KS_RETURN_IF_ERROR(SubmitRepairs());
          continue;
        }
        std::lock_guard<std::mutex> lock(mu_);
        if (pool_->OutstandingLocked() == 0 && pending_signal_ == 0) break;
      }
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto wait_start = Clock::now();
      cv_.wait(lock, [&] { return pool_->OutstandingLocked() == 0; });
      llm_wait_s_ += Seconds(wait_start);
      if (!fatal_.ok()) return fatal_;
      *generated_something = generated_count_ > 0;
    }
    bool interrupted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      interrupted = first_pass_interrupted_ || StoppingLocked();
    }
    if (!round.generated && !interrupted) KS_RETURN_IF_ERROR(store_->MarkRoundGenerated(search_id_, round.round));
    return Status::Ok();
  }

  // ---- beam selection ----

  StatusOr<std::vector<int64_t>> SelectBeam() {
    KS_ASSIGN_OR_RETURN(auto correct, store_->CorrectCandidates(search_id_));
    return ks::SelectBeam(correct, config_.beam, config_.seed);
  }

  // ---- generation tasks ----

  Status SubmitFirstPass(const RoundRow& round) {
    int r = round.round;
    if (round.beam.empty()) {
      if (r == 0 && !config_.seed_source.empty()) {
        IdeaRow idea{.search_id = search_id_, .round = 0, .text = "seed kernel" +
                     (config_.seed_label.empty() ? std::string() : " (" + config_.seed_label + ")"),
                     .slot_key = "r0/seed"};
        KS_ASSIGN_OR_RETURN(int64_t idea_id, store_->PutIdea(idea));
        CandidateRow c{.search_id = search_id_, .round = 0, .idea_id = idea_id, .source = config_.seed_source,
                       .plan_json = config_.seed_plan, .kind = CandidateKind::kSeed, .slot_key = "r0/seed/b0"};
        KS_ASSIGN_OR_RETURN(auto existing, store_->FindCandidateBySlot(search_id_, c.slot_key));
        KS_ASSIGN_OR_RETURN(int64_t id, store_->PutCandidate(c));
        if (!existing) CandidateStored(id, idea_id, /*pending=*/true);
        return Status::Ok();
      }
      IdeaRow idea{.search_id = search_id_, .round = r, .text = kFirstIdea,
                   .slot_key = fmt::format("r{}/first", r)};
      KS_ASSIGN_OR_RETURN(int64_t idea_id, store_->PutIdea(idea));
      idea.id = idea_id;
      std::lock_guard<std::mutex> lock(mu_);
      for (int k = 0; k < config_.branches; ++k)
        pool_->SubmitLocked([this, idea, k] { Guard([&] { return ImplementTask(idea, std::nullopt, k); }); });
      return Status::Ok();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t parent : round.beam)
      pool_->SubmitLocked([this, r, parent] { Guard([&] { return IdeasTask(r, parent); }); });
    return Status::Ok();
  }

  Status SubmitRepairs() {
    if (config_.repair_attempts <= 0) return Status::Ok();
    KS_ASSIGN_OR_RETURN(auto cands, store_->ListCandidates(search_id_));
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : cands) {
      if (c.round != round_ || !RepairEligible(c) || repairs_submitted_.count(c.id)) continue;
      repairs_submitted_.insert(c.id);
      pool_->SubmitLocked([this, c] { Guard([&] { return RepairTask(c); }); });
    }
    return Status::Ok();
  }

  // Runs a task body; a Status error (the store failing) stops the search.
  void Guard(const std::function<Status()>& body) {
    Status st = body();
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (fatal_.ok()) fatal_ = st;
      cv_.notify_all();
    }
  }

  // What the prompts show of a parent kernel.
  StatusOr<ParentKernel> Parent(std::optional<int64_t> parent_id) {
    ParentKernel p;
    if (!parent_id) return p;
    KS_ASSIGN_OR_RETURN(CandidateRow c, store_->GetCandidate(*parent_id));
    p.candidate = Candidate{c.source, c.plan_json};
    if (c.evaluation) {
      KS_ASSIGN_OR_RETURN(Evaluation e, StoredEvaluation(c));
      p.eager = e.eager;
      p.compiled = e.compiled;
      p.evaluation = std::move(e);
    }
    return p;
  }

  // Ideas tried in the lineage of `parent` before round `round`, with what came
  // of each. Ordered by round and text, never by id, so that the prompt is the
  // same in every run of the search.
  StatusOr<std::vector<TriedIdea>> TriedIdeas(int64_t parent, int round) {
    KS_ASSIGN_OR_RETURN(auto lineage, store_->Lineage(parent));
    KS_ASSIGN_OR_RETURN(auto ideas, store_->ListIdeas(search_id_));
    KS_ASSIGN_OR_RETURN(auto cands, store_->ListCandidates(search_id_));
    std::set<int64_t> ancestors;
    std::map<int64_t, double> ancestor_ms;
    for (const auto& a : lineage) {
      ancestors.insert(a.id);
      if (a.evaluation && a.evaluation->median_ms) ancestor_ms[a.id] = *a.evaluation->median_ms;
    }
    std::vector<std::pair<int, TriedIdea>> tried;
    for (const auto& idea : ideas) {
      if (idea.round >= round || !idea.parent_candidate || !ancestors.count(*idea.parent_candidate)) continue;
      std::optional<double> best_ms;
      const CandidateRow* best = nullptr;
      const CandidateRow* failed = nullptr;
      int n = 0;
      for (const auto& c : cands) {
        if (c.idea_id != idea.id || !c.evaluation) continue;
        ++n;
        if (c.evaluation->status == EvalStatus::kCorrect && c.evaluation->median_ms) {
          if (!best_ms || *c.evaluation->median_ms < *best_ms) best_ms = c.evaluation->median_ms, best = &c;
        } else if (!failed) {
          failed = &c;
        }
      }
      std::string outcome;
      if (best_ms) {
        auto parent_ms = ancestor_ms.find(*idea.parent_candidate);
        outcome = parent_ms != ancestor_ms.end()
                      ? fmt::format("correct, {:.2f}x over its parent ({:.4f} ms)", parent_ms->second / *best_ms,
                                    *best_ms)
                      : fmt::format("correct, {:.4f} ms", *best_ms);
        // The measured figures, so that a model sees why an idea paid off or not.
        if (auto e = StoredEvaluation(*best); e.ok()) outcome += "; measured: " + FiguresLine(*e);
      } else if (n > 0) {
        std::string failure = EvalStatusName(failed->evaluation->status);
        if (auto e = StoredEvaluation(*failed); e.ok() && !e->message.empty())
          failure += ": " + (e->message.size() > 300 ? e->message.substr(0, 300) + " [...]" : e->message);
        outcome = "no correct implementation (" + failure + ")";
      } else {
        outcome = "no implementation yet";
      }
      tried.push_back({idea.round, TriedIdea{idea.text, outcome}});
    }
    std::sort(tried.begin(), tried.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second.idea < b.second.idea;
    });
    std::vector<TriedIdea> out;
    for (auto& t : tried) out.push_back(std::move(t.second));
    return out;
  }

  // The fastest correct kernels of this search from rounds before `round`,
  // with their ideas and figures; ties by id, so the prompt is the same in
  // every run of the search.
  StatusOr<std::vector<TopKernel>> BestKernels(int64_t parent, int round) {
    constexpr size_t kShown = 5;
    KS_ASSIGN_OR_RETURN(auto cands, store_->ListCandidates(search_id_));
    KS_ASSIGN_OR_RETURN(auto ideas, store_->ListIdeas(search_id_));
    std::vector<const CandidateRow*> correct;
    for (const auto& c : cands)
      if (c.round < round && c.evaluation && c.evaluation->status == EvalStatus::kCorrect && c.evaluation->median_ms)
        correct.push_back(&c);
    std::sort(correct.begin(), correct.end(), [](const CandidateRow* a, const CandidateRow* b) {
      return *a->evaluation->median_ms != *b->evaluation->median_ms
                 ? *a->evaluation->median_ms < *b->evaluation->median_ms
                 : a->id < b->id;
    });
    std::vector<TopKernel> out;
    for (const CandidateRow* c : correct) {
      if (out.size() == kShown) break;
      TopKernel k;
      k.id = c->id;
      k.is_parent = c->id == parent;
      for (const auto& idea : ideas)
        if (c->idea_id && idea.id == *c->idea_id) k.idea = idea.text;
      KS_ASSIGN_OR_RETURN(k.evaluation, StoredEvaluation(*c));
      out.push_back(std::move(k));
    }
    return out;
  }

  Status IdeasTask(int round, int64_t parent) {
    if (Stopping()) return MarkInterrupted();
    IdeasPromptInputs in;
    in.problem = problem_;
    KS_ASSIGN_OR_RETURN(in.parent, Parent(parent));
    KS_ASSIGN_OR_RETURN(in.tried, TriedIdeas(parent, round));
    KS_ASSIGN_OR_RETURN(in.best, BestKernels(parent, round));
    in.num_ideas = config_.ideas;
    in.bank = bank_;
    KS_ASSIGN_OR_RETURN(RenderedPrompt prompt, RenderIdeasPrompt(*o_->deps_.prompts, in));
    std::string slot = fmt::format("r{}/p{}", round, parent);
    KS_RETURN_IF_ERROR(RecordBank(slot));
    KS_ASSIGN_OR_RETURN(std::optional<std::string> reply, Call(prompt, "ideas", slot, /*first_pass=*/true));
    if (!reply) return Status::Ok();
    auto parsed = ParseIdeas(*reply);
    if (!parsed.ok()) return Status::Ok();  // the reply is in the store; the parent gets no ideas this round
    int n = std::min<int>(config_.ideas, static_cast<int>(parsed->size()));
    for (int i = 0; i < n; ++i) {
      IdeaRow idea{.search_id = search_id_, .round = round, .parent_candidate = parent,
                   .text = (*parsed)[i].Text(), .slot_key = fmt::format("{}/i{}", slot, i)};
      KS_ASSIGN_OR_RETURN(auto existing, store_->FindIdeaBySlot(search_id_, idea.slot_key));
      KS_ASSIGN_OR_RETURN(idea.id, store_->PutIdea(idea));
      if (!existing)
        Emit({.type = SearchEvent::Type::kIdeaProposed, .round = round, .idea_id = idea.id, .candidate_id = parent,
              .text = idea.text});
      std::lock_guard<std::mutex> lock(mu_);
      for (int k = 0; k < config_.branches; ++k)
        pool_->SubmitLocked([this, idea, parent, k] { Guard([&] { return ImplementTask(idea, parent, k); }); });
    }
    return Status::Ok();
  }

  Status ImplementTask(const IdeaRow& idea, std::optional<int64_t> parent, int branch) {
    std::string slot = fmt::format("r{}/i{}/b{}", idea.round, idea.id, branch);
    KS_ASSIGN_OR_RETURN(auto existing, store_->FindCandidateBySlot(search_id_, slot));
    if (existing) return Status::Ok();
    if (Stopping()) return MarkInterrupted();
    ImplementPromptInputs in;
    in.problem = problem_;
    KS_ASSIGN_OR_RETURN(in.parent, Parent(parent));
    in.idea = idea.text;
    in.bank = bank_;
    KS_ASSIGN_OR_RETURN(RenderedPrompt prompt, RenderImplementPrompt(*o_->deps_.prompts, in));
    if (!parent) KS_RETURN_IF_ERROR(RecordBank(slot));  // prompts show the bank only without a parent
    KS_ASSIGN_OR_RETURN(std::optional<std::string> reply, Call(prompt, "implement", slot, /*first_pass=*/true));
    if (!reply) return Status::Ok();
    CandidateRow c{.search_id = search_id_, .round = idea.round, .idea_id = idea.id, .parent_candidate = parent,
                   .kind = CandidateKind::kPrimary, .branch = branch, .slot_key = slot};
    return StoreReply(c, *reply);
  }

  // The lineage keeps which bank kernels the prompt of `slot` showed.
  Status RecordBank(const std::string& slot) {
    if (bank_.empty()) return Status::Ok();
    std::vector<int64_t> ids;
    for (const auto& b : bank_) ids.push_back(b.candidate_id);
    return store_->RecordBankShown(search_id_, slot, ids);
  }

  Status RepairTask(const CandidateRow& failed) {
    std::string slot = fmt::format("repair/c{}", failed.id);
    KS_ASSIGN_OR_RETURN(auto existing, store_->FindCandidateBySlot(search_id_, slot));
    if (existing) return store_->MarkRepairAttempted(failed.id);
    if (Stopping()) return Status::Ok();
    RepairPromptInputs in;
    in.problem = problem_;
    if (failed.idea_id) {
      KS_ASSIGN_OR_RETURN(IdeaRow idea, store_->GetIdea(*failed.idea_id));
      in.idea = idea.text;
    }
    in.candidate = Candidate{failed.source, failed.plan_json};
    KS_ASSIGN_OR_RETURN(in.evaluation, StoredEvaluation(failed));
    KS_ASSIGN_OR_RETURN(RenderedPrompt prompt, RenderRepairPrompt(*o_->deps_.prompts, in));
    bool refused = false;
    KS_ASSIGN_OR_RETURN(std::optional<std::string> reply, Call(prompt, "repair", slot, false, &refused));
    if (refused) return Status::Ok();  // not attempted: a resumed search with budget left tries again
    if (reply) {
      CandidateRow c{.search_id = search_id_, .round = failed.round, .idea_id = failed.idea_id,
                     .parent_candidate = failed.id, .kind = CandidateKind::kRepair,
                     .repair_depth = failed.repair_depth + 1, .slot_key = slot};
      KS_RETURN_IF_ERROR(StoreReply(c, *reply));
    }
    return store_->MarkRepairAttempted(failed.id);
  }

  // Stores a candidate from a model's reply: pending when it parsed, otherwise
  // evaluated at once as a compile error carrying the parser's reason (a reply
  // without a kernel is a failed candidate, which a repair may fix).
  Status StoreReply(CandidateRow c, const std::string& reply) {
    ParsedCandidate parsed = ParseCandidateResponse(reply);
    KS_ASSIGN_OR_RETURN(auto existing, store_->FindCandidateBySlot(search_id_, c.slot_key));
    if (parsed.ok()) {
      c.source = parsed.candidate.source;
      c.plan_json = parsed.candidate.plan_json;
    } else {
      c.raw_response = parsed.raw;
    }
    KS_ASSIGN_OR_RETURN(int64_t id, store_->PutCandidate(c));
    if (existing) return Status::Ok();
    if (!parsed.ok()) {
      Evaluation e;
      e.status = EvalStatus::kCompileError;
      e.message = "the model's reply holds no usable candidate: " + parsed.parse_error;
      KS_RETURN_IF_ERROR(store_->PutEvaluation(id, e, std::nullopt));
      CandidateStored(id, c.idea_id.value_or(0), /*pending=*/false);
      Evaluated(c.round, id, e, false);
      return Status::Ok();
    }
    CandidateStored(id, c.idea_id.value_or(0), /*pending=*/true);
    return Status::Ok();
  }

  void CandidateStored(int64_t id, int64_t idea_id, bool pending) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generated_count_;
      if (pending) ++pending_signal_;
      cv_.notify_all();
    }
    Emit({.type = SearchEvent::Type::kCandidateGenerated, .round = round_, .idea_id = idea_id, .candidate_id = id});
  }

  Status MarkInterrupted() {
    std::lock_guard<std::mutex> lock(mu_);
    first_pass_interrupted_ = true;
    return Status::Ok();
  }

  // ---- model calls ----

  // The reply of a model call: found in the store (a resumed search), or made
  // and stored. nullopt when the call failed (stored with its error) or was
  // refused because a budget is spent or the search is stopping (*refused).
  StatusOr<std::optional<std::string>> Call(const RenderedPrompt& prompt, const std::string& role,
                                            const std::string& slot, bool first_pass, bool* refused = nullptr) {
    LlmRequest request = prompt.ToRequest(role);
    std::string hash = store::PromptHash(role, request.system, request.prompt);
    KS_ASSIGN_OR_RETURN(auto found, store_->FindFinishedLlmCall(search_id_, role, hash, slot));
    if (found) {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_reused_;
      return std::optional<std::string>(found->record.response);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::string why = BudgetSpentLocked();
      if (!why.empty() && stop_reason_.empty()) stop_reason_ = why;
      if (!stop_reason_.empty() || Cancelled()) {
        if (first_pass) first_pass_interrupted_ = true;
        if (refused) *refused = true;
        cv_.notify_all();
        return std::optional<std::string>();
      }
      ++spend_.calls;  // reserved now, so that concurrent calls cannot overrun the call budget
      ++calls_now_;
    }
    LlmCallRecord record;
    auto reply = o_->deps_.llm->Complete(request, &record);
    // Backends fill the record; these make it complete whatever the backend did.
    if (record.role.empty()) record.role = role;
    if (record.prompt.empty()) record.prompt = request.prompt;
    if (record.system.empty()) record.system = request.system;
    if (!reply.ok() && record.error.empty()) record.error = reply.status().ToString();
    if (reply.ok()) record.error.clear();
    KS_RETURN_IF_ERROR(store_->PutLlmCall(search_id_, slot, record).status());
    {
      std::lock_guard<std::mutex> lock(mu_);
      spend_.tokens_in += record.tokens_in;
      spend_.tokens_out += record.tokens_out;
      spend_.cost_usd += record.cost_usd;
    }
    Emit({.type = SearchEvent::Type::kLlmCall, .round = round_, .text = role, .error = record.error});
    if (!reply.ok() && !Cancelled()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++llm_failed_now_;
      if (first_llm_error_.empty()) first_llm_error_ = record.error;
    }
    if (!reply.ok()) {
      // A call cut short by our own cancel was not really attempted.
      if (Cancelled() && first_pass) MarkInterrupted();
      return std::optional<std::string>();
    }
    return std::optional<std::string>(*reply);
  }

  std::string BudgetSpentLocked() const {
    if (config_.budget_calls > 0 && spend_.calls >= config_.budget_calls)
      return fmt::format("budget: {} model calls", config_.budget_calls);
    if (config_.budget_tokens > 0 && spend_.tokens_in + spend_.tokens_out >= config_.budget_tokens)
      return fmt::format("budget: {} tokens", config_.budget_tokens);
    if (config_.budget_cost_usd > 0 && spend_.cost_usd >= config_.budget_cost_usd)
      return fmt::format("budget: ${}", config_.budget_cost_usd);
    if (config_.budget_minutes > 0 && prior_elapsed_s_ + Seconds(start_) >= config_.budget_minutes * 60)
      return fmt::format("budget: {} minutes", config_.budget_minutes);
    return "";
  }

  // ---- evaluation ----

  // Evaluates everything pending in the search, identical candidates once;
  // returns how many candidates got an evaluation.
  StatusOr<int64_t> EvaluateBatch() {
    KS_ASSIGN_OR_RETURN(auto pending, store_->PendingCandidates(search_id_));
    if (pending.empty()) return int64_t{0};
    // Group by content; each group is evaluated once (or not at all, when an
    // identical candidate of the same problem was evaluated before).
    std::map<std::string, std::vector<const CandidateRow*>> groups;
    std::vector<std::string> order;
    for (const auto& c : pending) {
      auto& g = groups[c.content_hash];
      if (g.empty()) order.push_back(c.content_hash);
      g.push_back(&c);
    }
    std::vector<Candidate> batch;
    std::vector<std::string> batch_hashes;
    int64_t done = 0;
    for (const auto& hash : order) {
      const auto& group = groups[hash];
      KS_ASSIGN_OR_RETURN(auto earlier, store_->FindEvaluatedByHash(search_.problem_id, hash));
      if (earlier) {
        KS_ASSIGN_OR_RETURN(Evaluation e, StoredEvaluation(*earlier));
        for (const CandidateRow* c : group) {
          KS_RETURN_IF_ERROR(store_->PutEvaluation(c->id, e, earlier->id));
          Evaluated(c->round, c->id, e, true);
          ++done;
        }
        continue;
      }
      batch.push_back(Candidate{group.front()->source, group.front()->plan_json});
      batch_hashes.push_back(hash);
    }
    if (!batch.empty()) {
      auto t0 = Clock::now();
      auto results = o_->deps_.evaluator->EvaluateBatch(batch);
      evaluator_s_ += Seconds(t0);
      if (!results.ok()) return results.status().WithContext("evaluator");
      if (results->size() != batch.size())
        return Internal(fmt::format("evaluator returned {} results for {} candidates", results->size(), batch.size()));
      for (size_t i = 0; i < batch.size(); ++i) {
        const auto& group = groups[batch_hashes[i]];
        const Evaluation& e = (*results)[i];
        int64_t first = group.front()->id;
        for (const CandidateRow* c : group) {
          std::optional<int64_t> from;
          if (c->id != first) from = first;
          KS_RETURN_IF_ERROR(store_->PutEvaluation(c->id, e, from));
          Evaluated(c->round, c->id, e, from.has_value());
          ++done;
        }
      }
    }
    KS_RETURN_IF_ERROR(UpdateBest());
    KS_RETURN_IF_ERROR(SaveElapsed());
    return done;
  }

  // Adds the wall time since the last save to the search's stored total (Run
  // thread only). Saved after every evaluated batch and at the end, so that a
  // killed process loses at most the time since its last batch.
  Status SaveElapsed() {
    auto now = Clock::now();
    double delta = std::chrono::duration<double>(now - elapsed_mark_).count();
    elapsed_mark_ = now;
    return store_->AddSearchElapsed(search_id_, delta);
  }

  void Evaluated(int round, int64_t id, const Evaluation& e, bool reused) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++evaluated_total_;
      ++evaluated_now_;
      if (!e.correct()) ++failed_total_;
    }
    Emit({.type = SearchEvent::Type::kCandidateEvaluated, .round = round, .candidate_id = id,
          .eval_status = e.status, .speedup = e.correct() ? e.speedup_eager : std::nullopt, .reused = reused});
  }

  Status UpdateBest() {
    KS_ASSIGN_OR_RETURN(auto best, store_->BestCorrect(search_id_));
    if (!best || (best_id_ && *best_id_ == best->id)) return Status::Ok();
    best_id_ = best->id;
    std::optional<double> speedup = best->evaluation->speedup_eager;
    {
      std::lock_guard<std::mutex> lock(mu_);
      best_speedup_ = speedup;
      if (config_.target_speedup > 0 && speedup && *speedup >= config_.target_speedup && stop_reason_.empty())
        stop_reason_ = fmt::format("target speedup {:.2f}x reached", config_.target_speedup);
    }
    KS_RETURN_IF_ERROR(store_->SetBestCandidate(search_id_, best->id));
    Emit({.type = SearchEvent::Type::kNewBest, .round = best->round, .candidate_id = best->id, .speedup = speedup});
    return Status::Ok();
  }

  // ---- stopping and finishing ----

  bool Cancelled() const { return o_->cancelled(); }
  // No new model calls: cancelled, a budget spent, the target reached, or a task failed.
  bool Stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return StoppingLocked();
  }
  bool StoppingLocked() {
    if (stop_reason_.empty()) {
      std::string why = BudgetSpentLocked();
      if (!why.empty()) stop_reason_ = why;
    }
    return Cancelled() || !stop_reason_.empty() || !fatal_.ok();
  }

  std::optional<double> BestSpeedup() {
    std::lock_guard<std::mutex> lock(mu_);
    return best_speedup_;
  }

  Status Done(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_reason_.empty()) stop_reason_ = reason;
    finished_ = true;
    return Status::Ok();
  }

  StatusOr<SearchOutcome> Finish() {
    Status saved = SaveElapsed();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!saved.ok() && fatal_.ok()) fatal_ = saved;
    }
    SearchOutcome out = Outcome();
    SearchStatus status;
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reason = stop_reason_;
      if (!fatal_.ok()) {
        status = SearchStatus::kFailed;
        reason = fatal_.ToString();
      } else if (Cancelled()) {
        status = SearchStatus::kCancelled;
        reason = "cancelled";
      } else if (finished_ || !stop_reason_.empty()) {
        status = SearchStatus::kFinished;
      } else {
        status = SearchStatus::kRunning;  // a generate-only step: the search goes on
        reason = generate_only_note_;
      }
    }
    Status st = store_->SetSearchStatus(search_id_, status, status == SearchStatus::kRunning ? "" : reason);
    out.status = status;
    out.stop_reason = reason;
    auto pending = store_->PendingCandidates(search_id_);
    if (pending.ok()) out.pending = static_cast<int64_t>(pending->size());
    SearchEvent done{.type = SearchEvent::Type::kFinished, .round = round_, .text = reason,
                     .error = out.first_llm_error};
    done.final_status = status;
    Emit(done);
    if (!fatal_.ok()) return fatal_;
    if (!st.ok()) return st;
    return out;
  }

  SearchOutcome Outcome() {
    std::lock_guard<std::mutex> lock(mu_);
    SearchOutcome out;
    out.search_id = search_id_;
    out.best_candidate = best_id_;
    out.best_speedup = best_speedup_;
    out.evaluated_now = evaluated_now_;
    out.llm_calls_now = calls_now_;
    out.llm_calls_reused = calls_reused_;
    out.llm_failed_now = llm_failed_now_;
    out.first_llm_error = first_llm_error_;
    out.wall_s = Seconds(start_);
    out.total_elapsed_s = prior_elapsed_s_ + out.wall_s;
    out.evaluator_s = evaluator_s_;
    out.llm_wait_s = llm_wait_s_;
    return out;
  }

  void Emit(SearchEvent e) {
    if (!o_->on_event_) return;
    e.search_id = search_id_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      e.best_speedup = best_speedup_;
      e.evaluated = evaluated_total_;
      e.failed = failed_total_;
      e.llm_calls = spend_.calls;
      e.llm_failed = llm_failed_now_;
      e.tokens = spend_.tokens_in + spend_.tokens_out;
      e.cost_usd = spend_.cost_usd;
    }
    std::lock_guard<std::mutex> lock(emit_mu_);
    o_->on_event_(e);
  }

  Orchestrator* const o_;
  store::LineageStore* const store_;
  const int64_t search_id_;
  store::SearchRow search_;
  SearchConfig config_;
  ProblemContext problem_;
  Clock::time_point start_;
  Clock::time_point elapsed_mark_;  // Run thread only: when elapsed time was last saved
  double prior_elapsed_s_ = 0;      // spent on the search by earlier processes (as loaded)
  std::atomic<int> round_{-1};

  std::mutex mu_;
  std::condition_variable cv_;
  std::mutex emit_mu_;  // serializes the event callback
  std::unique_ptr<TaskPool> pool_;
  Status fatal_;                       // (mu_) the first error of a task
  std::string stop_reason_;            // (mu_) budget or target: no new model calls
  std::string generate_only_note_;
  bool finished_ = false;              // (mu_)
  bool first_pass_interrupted_ = false;  // (mu_)
  int64_t pending_signal_ = 0;         // (mu_) candidates stored since the last batch
  int64_t generated_count_ = 0;        // (mu_) candidates stored by this round's processing
  std::set<int64_t> repairs_submitted_;  // (mu_)
  store::LlmSpend spend_;              // (mu_) search-wide
  int64_t calls_now_ = 0;              // (mu_)
  int64_t calls_reused_ = 0;           // (mu_)
  int64_t llm_failed_now_ = 0;         // (mu_)
  std::string first_llm_error_;        // (mu_)
  std::vector<BankKernel> bank_;       // fixed by Load()
  int64_t evaluated_total_ = 0;        // (mu_)
  int64_t failed_total_ = 0;           // (mu_)
  int64_t evaluated_now_ = 0;          // (mu_)
  std::optional<int64_t> best_id_;     // written by the Run thread only
  std::optional<double> best_speedup_;  // (mu_) for readers on other threads
  double evaluator_s_ = 0;             // Run thread only
  double llm_wait_s_ = 0;              // (mu_)
};

Orchestrator::Orchestrator(Deps deps, SearchEventCallback on_event)
    : deps_(deps), on_event_(std::move(on_event)) {
  KS_CHECK(deps_.store != nullptr);
}

Orchestrator::~Orchestrator() = default;

bool Orchestrator::cancelled() const { return cancel_.load() || (deps_.cancel && deps_.cancel->load()); }

StatusOr<int64_t> Orchestrator::CreateSearch(store::LineageStore* store, const std::string& problem_file,
                                             const std::string& problem_source, const Signature& signature,
                                             const SearchConfig& config) {
  KS_RETURN_IF_ERROR(config.Validate());
  store::ProblemRow p;
  p.name = signature.name;
  if (p.name.empty()) {
    std::string stem = problem_file.substr(problem_file.find_last_of('/') + 1);
    p.name = stem.substr(0, stem.rfind(".py") == std::string::npos ? stem.size() : stem.rfind(".py"));
  }
  p.file_path = problem_file;
  p.source = problem_source;
  p.signature_json = signature.inputs.empty() && signature.outputs.empty() ? "{}" : SignatureToJson(signature).dump();
  KS_ASSIGN_OR_RETURN(int64_t problem_id, store->PutProblem(p));
  return store->CreateSearch(problem_id, SearchConfigToJson(config).dump());
}

StatusOr<SearchOutcome> Orchestrator::Run(int64_t search_id, Mode mode) {
  SearchRun run(this, search_id);
  return run.Run(mode);
}

StatusOr<SearchOutcome> Orchestrator::EvaluatePending(int64_t search_id) {
  SearchRun run(this, search_id);
  return run.EvaluateOnly();
}

}  // namespace ks
