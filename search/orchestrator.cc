#include "search/orchestrator.h"

#include "search/search_run.h"

#include "evaluator/judge/judge.h"
#include "search/search_setup.h"  // kStopRounds

// The round loop (search_run.h lists the other files).
namespace ks {

const char* SearchEventTypeName(SearchEvent::Type t) {
  switch (t) {
    case SearchEvent::Type::kRoundStarted: return "round_started";
    case SearchEvent::Type::kIdeaProposed: return "idea_proposed";
    case SearchEvent::Type::kCandidateGenerated: return "candidate_generated";
    case SearchEvent::Type::kCandidateEvaluated: return "candidate_evaluated";
    case SearchEvent::Type::kNewBest: return "new_best";
    case SearchEvent::Type::kLlmCall: return "llm_call";
    case SearchEvent::Type::kFinished: return "finished";
    case SearchEvent::Type::kNote: return "note";
  }
  return "?";
}

nlohmann::json SearchEventToJson(const SearchEvent& e) {
  nlohmann::json j = {{"event", SearchEventTypeName(e.type)},
                      {"search", e.search_id},
                      {"evaluated", e.evaluated},
                      {"failed", e.failed},
                      {"llm_calls", e.llm_calls},
                      {"tokens", e.tokens},
                      {"cost_usd", e.cost_usd}};
  if (e.round >= 0) j["round"] = e.round;  // none before a search's first round
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

Status Orchestrator::SearchRun::Load() {
  KS_ASSIGN_OR_RETURN(search_, store_->GetSearch(search_id_));
  prior_elapsed_s_ = search_.elapsed_s;
  KS_ASSIGN_OR_RETURN(std::optional<RoundRow> last, store_->LastRound(search_id_));
  // Events before this run starts a round (a search that has nothing left to
  // do finishes at once) name the last round it has, never none.
  if (last) round_ = last->round;
  if (search_.status == SearchStatus::kFailed && last) {
    // Resumed after a failure (another --model, the server back): the round it
    // failed on is not judged again; a new round starts.
    judged_round_ = last->round;
  }
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
  problem_.judging = DescribeContract(config_.precision);
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

Status Orchestrator::SearchRun::LoadMeasuredFacts() {
  // Measured facts in the config are final; datasheet figures give way to what
  // the GPU side measured as soon as it has reported.
  if (problem_.gpu.sm_count > 0 && problem_.gpu.memory_bandwidth_gbps > 0 && !problem_.gpu.from_datasheet())
    return Status::Ok();
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

StatusOr<SearchOutcome> Orchestrator::SearchRun::Run(Mode mode) {
  start_ = Clock::now();
  elapsed_mark_ = start_;
  if (!o_->deps_.llm || !o_->deps_.prompts) return FailedPrecondition("the search needs an LLM client and prompts");
  if (mode == Mode::kContinuous && !o_->deps_.evaluator)
    return FailedPrecondition("no evaluator: run with --generate-only, then evaluate-pending on a GPU node");
  KS_RETURN_IF_ERROR(Load());
  // An agent tests its drafts between model turns (search/agent.h): the model
  // side of a split search cannot; a server with GPU workers leases each tool
  // call to one (server/practice_calls.h).
  if (config_.implement == ImplementMode::kAgent && !o_->deps_.practice_evaluator)
    return FailedPrecondition("search " + std::to_string(search_id_) +
                              " implements with an agent, whose compile and test tools need the GPU side beside the "
                              "model: run it where both are reachable (not --generate-only), or submit it to "
                              "`kernelsearch serve --evaluator workers`, whose `kernelsearch gpu-worker` processes "
                              "serve its tool calls");
  KS_RETURN_IF_ERROR(store_->SetSearchStatus(search_id_, SearchStatus::kRunning, ""));
  pool_ = std::make_unique<TaskPool>(config_.llm_concurrency, &mu_, &cv_);
  Status st = Loop(mode);
  pool_.reset();  // joins; tasks that were still queued run (and see the stop)
  if (!st.ok() && fatal_.ok()) fatal_ = st;
  return Finish();
}

StatusOr<SearchOutcome> Orchestrator::SearchRun::EvaluateOnly() {
  start_ = Clock::now();
  elapsed_mark_ = start_;
  if (!o_->deps_.evaluator) return FailedPrecondition("evaluate-pending needs an evaluator");
  KS_RETURN_IF_ERROR(Load());
  auto n = EvaluateBatch();
  if (n.ok()) {
    // evaluate-pending on a GPU node: the counters of each round's fastest, for
    // the prompts the model side renders next.
    std::set<int> rounds;
    if (auto cands = store_->ListCandidates(search_id_); cands.ok())
      for (const auto& c : *cands) rounds.insert(c.round);
    if (Status st = ReadCountersOfBest(rounds); !st.ok()) n = st;
  }
  Status saved = SaveElapsed();
  if (!n.ok()) return n.status();
  KS_RETURN_IF_ERROR(saved);
  SearchOutcome out = Outcome();
  KS_ASSIGN_OR_RETURN(auto s, store_->GetSearch(search_id_));
  out.status = s.status;
  out.stop_reason = s.stop_reason;
  return out;
}

Status Orchestrator::SearchRun::Loop(Mode mode) {
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
      int failed_rounds = 0;
      if (last) {
        KS_ASSIGN_OR_RETURN(std::vector<std::string> failures, RoundFailures(last->round));
        if (last->round != judged_round_ && !failures.back().empty()) {
          std::lock_guard<std::mutex> lock(mu_);
          failure_ = failures.back();
          return Status::Ok();
        }
        for (const auto& why : failures) failed_rounds += why.empty() ? 0 : 1;
      }
      int next = last ? last->round + 1 : 0;
      if (next - failed_rounds > config_.rounds) return Done(kStopRounds);
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

StatusOr<std::vector<std::string>> Orchestrator::SearchRun::RoundFailures(int last) {
  KS_ASSIGN_OR_RETURN(auto cands, store_->ListCandidates(search_id_));
  KS_ASSIGN_OR_RETURN(auto calls, store_->ListLlmCalls(search_id_, /*finished_only=*/false));
  struct Tally {
    int64_t candidates = 0, parsable = 0, calls = 0, failed = 0;
    std::string first_error;
  };
  std::vector<Tally> t(last + 1);
  for (const auto& c : cands) {
    if (c.round < 0 || c.round > last) continue;
    ++t[c.round].candidates;
    if (!c.plan_json.empty()) ++t[c.round].parsable;
  }
  for (const auto& c : calls) {
    // Calls of repairs name no round (and are not counted), as before.
    StatusOr<SlotKey> slot = SlotKey::Parse(c.slot_key);
    if (!slot.ok() || !slot->Round()) continue;
    int r = *slot->Round();
    if (r < 0 || r > last) continue;
    ++t[r].calls;
    if (!c.record.error.empty() && t[r].failed++ == 0) t[r].first_error = c.record.error;
  }
  std::vector<std::string> out(last + 1);
  int64_t parsable_before = 0;
  for (int r = 0; r <= last; ++r) {
    const Tally& x = t[r];
    if (x.parsable == 0) {
      if (x.calls > 0 && x.failed == x.calls)
        out[r] = fmt::format("no kernel in round {}: every model call failed ({}); first error: {}", r, x.failed,
                             x.first_error);
      else if (parsable_before == 0)
        out[r] = fmt::format("no kernel: the model's replies in round {} held no parsable candidate ({} repl{}, "
                             "see `kernelsearch show` of a candidate for the reply)",
                             r, x.candidates, x.candidates == 1 ? "y" : "ies");
    }
    parsable_before += x.parsable;
  }
  return out;
}

StatusOr<bool> Orchestrator::SearchRun::RoundComplete(const RoundRow& round) {
  if (!round.generated) return false;
  KS_ASSIGN_OR_RETURN(auto cands, store_->ListCandidates(search_id_));
  for (const auto& c : cands) {
    if (c.round != round.round) continue;
    if (!c.evaluated) return false;
    if (RepairEligible(c)) return false;
  }
  return true;
}

bool Orchestrator::SearchRun::RepairEligible(const CandidateRow& c) const {
  return c.evaluated && c.evaluation && Repairable(c.evaluation->status) &&
         c.repair_depth < config_.repair_attempts && !c.repair_attempted;
}

Status Orchestrator::SearchRun::ProcessRound(const RoundRow& round, Mode mode, bool* generated_something) {
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
  // Once the round's candidates (repairs too) are evaluated: the counters of
  // its fastest, which the next round's prompts show.
  if (mode == Mode::kContinuous && !Cancelled()) KS_RETURN_IF_ERROR(ReadCountersOfBest({round.round}));
  return Status::Ok();
}

Status Orchestrator::SearchRun::SubmitFirstPass(const RoundRow& round) {
  int r = round.round;
  if (round.beam.empty()) {
    if (r == 0 && !config_.seed_source.empty()) {
      IdeaRow idea{.search_id = search_id_, .round = 0, .text = "seed kernel" +
                   (config_.seed_label.empty() ? std::string() : " (" + config_.seed_label + ")"),
                   .slot_key = SlotKey::SeedIdea().Format()};
      KS_ASSIGN_OR_RETURN(int64_t idea_id, store_->PutIdea(idea));
      CandidateRow c{.search_id = search_id_, .round = 0, .idea_id = idea_id, .source = config_.seed_source,
                     .plan_json = config_.seed_plan, .kind = CandidateKind::kSeed,
                     .slot_key = SlotKey::Seed().Format()};
      KS_ASSIGN_OR_RETURN(auto existing, store_->FindCandidateBySlot(search_id_, c.slot_key));
      KS_ASSIGN_OR_RETURN(int64_t id, store_->PutCandidate(c));
      if (!existing) CandidateStored(id, idea_id, /*pending=*/true);
      return Status::Ok();
    }
    IdeaRow idea{.search_id = search_id_, .round = r, .text = kFirstIdea,
                 .slot_key = SlotKey::FirstIdea(r).Format()};
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

Status Orchestrator::SearchRun::SubmitRepairs() {
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

StatusOr<int64_t> Orchestrator::SearchRun::EvaluateBatch() {
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
    KS_ASSIGN_OR_RETURN(auto earlier,
                        store_->FindEvaluatedByHash(search_.problem_id, hash, ContractName(config_.precision)));
    if (earlier) {
      KS_ASSIGN_OR_RETURN(Evaluation e, StoredEvaluation(*earlier));
      ApplyRobustPolicy(e, config_.require_robust);
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
    std::unique_lock<std::mutex> gpu(practice_mu_, std::defer_lock);
    if (o_->deps_.practice_evaluator) gpu.lock();  // no practice run beside the timed ones
    auto results = o_->deps_.evaluator->EvaluateBatch(batch);
    if (gpu.owns_lock()) gpu.unlock();
    evaluator_s_ += Seconds(t0);
    if (!results.ok()) return results.status().WithContext("evaluator");
    if (results->size() != batch.size())
      return Internal(fmt::format("evaluator returned {} results for {} candidates", results->size(), batch.size()));
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto& group = groups[batch_hashes[i]];
      Evaluation e = (*results)[i];
      ApplyRobustPolicy(e, config_.require_robust);
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

Status Orchestrator::SearchRun::ReadCountersOfBest(const std::set<int>& rounds) {
  if (config_.profile_top <= 0 || !o_->deps_.evaluator) return Status::Ok();
  KS_ASSIGN_OR_RETURN(auto correct, store_->CorrectCandidates(search_id_));  // fastest first
  std::map<int, int> taken;  // round -> candidates among its fastest so far
  std::vector<int64_t> ids;
  std::vector<Candidate> batch;
  for (const auto& c : correct) {
    if (!rounds.count(c.round) || taken[c.round]++ >= config_.profile_top) continue;
    if (!c.evaluation || counters_read_.count(c.id)) continue;
    // Read before (an earlier process of a resumed search, or a copy): kept.
    auto j = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
    if (j.is_object() && j.contains("counters")) continue;
    counters_read_.insert(c.id);
    ids.push_back(c.id);
    batch.push_back(Candidate{c.source, c.plan_json});
  }
  if (batch.empty()) return Status::Ok();
  auto t0 = Clock::now();
  std::unique_lock<std::mutex> gpu(practice_mu_, std::defer_lock);
  if (o_->deps_.practice_evaluator) gpu.lock();
  std::vector<CounterReport> reports = o_->deps_.evaluator->ReadCounters(batch);
  if (gpu.owns_lock()) gpu.unlock();
  counters_s_ += Seconds(t0);
  evaluator_s_ += Seconds(t0);
  for (size_t i = 0; i < ids.size() && i < reports.size(); ++i) {
    KS_RETURN_IF_ERROR(store_->SetEvaluationCounters(ids[i], CounterReportToJson(reports[i])));
    if (reports[i].launches.empty() && !reports[i].note.empty() && reports[i].note != counters_note_) {
      counters_note_ = reports[i].note;
      Emit({.type = SearchEvent::Type::kNote, .round = round_, .candidate_id = ids[i],
            .text = "no hardware counters for candidate " + std::to_string(ids[i]) + ": " + reports[i].note});
    }
  }
  return Status::Ok();
}

Status Orchestrator::SearchRun::SaveElapsed() {
  auto now = Clock::now();
  double delta = std::chrono::duration<double>(now - elapsed_mark_).count();
  elapsed_mark_ = now;
  return store_->AddSearchElapsed(search_id_, delta);
}

void Orchestrator::SearchRun::Evaluated(int round, int64_t id, const Evaluation& e, bool reused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++evaluated_total_;
    ++evaluated_now_;
    if (!e.correct()) ++failed_total_;
  }
  Emit({.type = SearchEvent::Type::kCandidateEvaluated, .round = round, .candidate_id = id,
        .eval_status = e.status, .speedup = e.correct() ? e.speedup_eager : std::nullopt, .reused = reused});
}

bool Orchestrator::SearchRun::Stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return StoppingLocked();
}

bool Orchestrator::SearchRun::StoppingLocked() {
  if (stop_reason_.empty()) {
    std::string why = BudgetSpentLocked();
    if (!why.empty()) stop_reason_ = why;
  }
  return Cancelled() || !stop_reason_.empty() || !fatal_.ok();
}

Status Orchestrator::SearchRun::Done(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_reason_.empty()) stop_reason_ = reason;
  finished_ = true;
  return Status::Ok();
}

StatusOr<SearchOutcome> Orchestrator::SearchRun::Finish() {
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
    } else if (!failure_.empty()) {
      status = SearchStatus::kFailed;
      reason = failure_;
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

SearchOutcome Orchestrator::SearchRun::Outcome() {
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

void Orchestrator::SearchRun::Emit(SearchEvent e) {
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
