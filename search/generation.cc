// The prompts of a search: a round's ideas, implementations and repairs, built
// from the lineage, the model calls that answer them, and the replies stored.

#include "search/search_run.h"

namespace ks {

void Orchestrator::SearchRun::Guard(const std::function<Status()>& body) {
  Status st = body();
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fatal_.ok()) fatal_ = st;
    cv_.notify_all();
  }
}

StatusOr<ParentKernel> Orchestrator::SearchRun::Parent(std::optional<int64_t> parent_id) {
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

StatusOr<std::vector<TriedIdea>> Orchestrator::SearchRun::TriedIdeas(int64_t parent, int round) {
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

StatusOr<std::vector<TopKernel>> Orchestrator::SearchRun::BestKernels(int64_t parent, int round) {
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

Status Orchestrator::SearchRun::IdeasTask(int round, int64_t parent) {
  if (Stopping()) return MarkInterrupted();
  IdeasPromptInputs in;
  in.problem = problem_;
  KS_ASSIGN_OR_RETURN(in.parent, Parent(parent));
  KS_ASSIGN_OR_RETURN(in.tried, TriedIdeas(parent, round));
  KS_ASSIGN_OR_RETURN(in.best, BestKernels(parent, round));
  in.num_ideas = config_.ideas;
  in.bank = bank_;
  KS_ASSIGN_OR_RETURN(RenderedPrompt prompt, RenderIdeasPrompt(*o_->deps_.prompts, in));
  const SlotKey ideas = SlotKey::Ideas(round, parent);
  const std::string slot = ideas.Format();
  KS_RETURN_IF_ERROR(RecordBank(slot));
  KS_ASSIGN_OR_RETURN(std::optional<std::string> reply, Call(prompt, "ideas", slot, /*first_pass=*/true));
  if (!reply) return Status::Ok();
  auto parsed = ParseIdeas(*reply);
  if (!parsed.ok()) return Status::Ok();  // the reply is in the store; the parent gets no ideas this round
  int n = std::min<int>(config_.ideas, static_cast<int>(parsed->size()));
  for (int i = 0; i < n; ++i) {
    IdeaRow idea{.search_id = search_id_, .round = round, .parent_candidate = parent,
                 .text = (*parsed)[i].Text(), .slot_key = ideas.IdeaAt(i).Format()};
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

Status Orchestrator::SearchRun::ImplementTask(const IdeaRow& idea, std::optional<int64_t> parent, int branch) {
  const std::string slot = SlotKey::Implement(idea.round, idea.id, branch).Format();
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
  if (config_.implement == ImplementMode::kAgent) return AgentImplement(idea, parent, branch, prompt, slot);
  KS_ASSIGN_OR_RETURN(std::optional<std::string> reply, Call(prompt, "implement", slot, /*first_pass=*/true));
  if (!reply) return Status::Ok();
  CandidateRow c{.search_id = search_id_, .round = idea.round, .idea_id = idea.id, .parent_candidate = parent,
                 .kind = CandidateKind::kPrimary, .branch = branch, .slot_key = slot};
  return StoreReply(c, *reply);
}

Status Orchestrator::SearchRun::RecordBank(const std::string& slot) {
  if (bank_.empty()) return Status::Ok();
  std::vector<int64_t> ids;
  for (const auto& b : bank_) ids.push_back(b.candidate_id);
  return store_->RecordBankShown(search_id_, slot, ids);
}

Status Orchestrator::SearchRun::RepairTask(const CandidateRow& failed) {
  const std::string slot = SlotKey::Repair(failed.id).Format();
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

Status Orchestrator::SearchRun::StoreReply(CandidateRow c, const std::string& reply) {
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

void Orchestrator::SearchRun::CandidateStored(int64_t id, int64_t idea_id, bool pending) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generated_count_;
    if (pending) ++pending_signal_;
    cv_.notify_all();
  }
  Emit({.type = SearchEvent::Type::kCandidateGenerated, .round = round_, .idea_id = idea_id, .candidate_id = id});
}

Status Orchestrator::SearchRun::MarkInterrupted() {
  std::lock_guard<std::mutex> lock(mu_);
  first_pass_interrupted_ = true;
  return Status::Ok();
}

StatusOr<std::optional<std::string>> Orchestrator::SearchRun::Call(const RenderedPrompt& prompt,
                                                                  const std::string& role, const std::string& slot,
                                                                  bool first_pass, bool* refused) {
  LlmRequest request = prompt.ToRequest(role);
  LedgerEntry entry{.role = role, .slot = slot, .prompt_hash = store::PromptHash(role, request.system, request.prompt),
                    .first_pass = first_pass, .refused = refused};
  return ledger_.Call<std::string>(
      entry,
      [&](LlmCallRecord* record) {
        auto reply = o_->deps_.llm->Complete(request, record);
        // Backends fill the record; these make it complete whatever the backend did.
        if (record->prompt.empty()) record->prompt = request.prompt;
        if (record->system.empty()) record->system = request.system;
        return reply;
      },
      [](const std::string& stored) { return StatusOr<std::string>(stored); });
}

bool Orchestrator::SearchRun::ReserveCall(bool first_pass, bool* refused) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string why = BudgetSpentLocked();
  if (!why.empty() && stop_reason_.empty()) stop_reason_ = why;
  if (!stop_reason_.empty() || Cancelled()) {
    if (first_pass) first_pass_interrupted_ = true;
    if (refused) *refused = true;
    cv_.notify_all();
    return false;
  }
  ++spend_.calls;  // reserved now, so that concurrent calls cannot overrun the call budget
  ++calls_now_;
  return true;
}

void Orchestrator::SearchRun::CallReused() {
  std::lock_guard<std::mutex> lock(mu_);
  ++calls_reused_;
}

Status Orchestrator::SearchRun::CallRecorded(const std::string& role, const Status& status, bool first_pass,
                                             const LlmCallRecord& record) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    spend_.tokens_in += record.tokens_in;
    spend_.tokens_out += record.tokens_out;
    spend_.cost_usd += record.cost_usd;
  }
  Emit({.type = SearchEvent::Type::kLlmCall, .round = round_, .text = role, .error = record.error});
  if (!status.ok() && !Cancelled()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++llm_failed_now_;
    if (first_llm_error_.empty()) first_llm_error_ = record.error;
  }
  // A call cut short by our own cancel was not really attempted.
  if (!status.ok() && Cancelled() && first_pass) return MarkInterrupted();
  return Status::Ok();
}

std::string Orchestrator::SearchRun::BudgetSpentLocked() const {
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

}  // namespace ks
