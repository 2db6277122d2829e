// The agent mode of the implement step inside a search run: the agent's model
// turns go through the run's budgets and store like every other call, its
// compile/test tools through the practice evaluator, and the candidate it ends
// with into the lineage as the one-shot step's would.

#include "search/search_run.h"

namespace ks {

// What search/agent.h's loop needs, served by the run. One per implementation.
class Orchestrator::SearchRun::AgentHostImpl final : public AgentHost {
 public:
  explicit AgentHostImpl(SearchRun* run) : run_(run) {}

  StatusOr<std::optional<AssistantReply>> Converse(const ConversationRequest& request,
                                                   const std::string& slot) override {
    SearchRun& r = *run_;
    std::string prompt = ConversationToJson(request).dump();
    LedgerEntry entry{.role = request.role, .slot = slot,
                      .prompt_hash = store::PromptHash(request.role, request.system, prompt), .first_pass = true};
    return r.ledger_.Call<AssistantReply>(
        entry,
        [&](LlmCallRecord* record) {
          ConversationRequest sent = request;
          sent.cancel = r.o_->deps_.cancel;
          auto reply = r.o_->deps_.llm->Converse(sent, record);
          // The stored prompt is what the resume lookup hashes, whatever the backend wrote.
          record->prompt = prompt;
          record->system = request.system;
          if (reply.ok()) record->response = ReplyToJson(*reply).dump();
          return reply;
        },
        [](const std::string& stored) {
          return ReplyFromJson(nlohmann::json::parse(stored, nullptr, /*allow_exceptions=*/false));
        });
  }

  StatusOr<Evaluation> Practice(const Candidate& candidate) override {
    CandidateEvaluator* ev = run_->o_->deps_.practice_evaluator;
    if (!ev)
      return FailedPrecondition("agent mode needs a practice evaluator (the GPU side); split searches "
                                "(--generate-only) cannot run it, `serve --evaluator workers` with gpu-workers can");
    auto gpu = GpuLock();
    KS_ASSIGN_OR_RETURN(std::vector<Evaluation> out, ev->EvaluateBatch({candidate}));
    if (out.size() != 1) return Internal("the practice evaluator returned " + std::to_string(out.size()) + " results");
    return std::move(out.front());
  }

  StatusOr<Evaluation> CompileOnly(const Candidate& candidate) override {
    CandidateEvaluator* ev = run_->o_->deps_.practice_evaluator;
    if (!ev) return FailedPrecondition("agent mode needs a practice evaluator (the GPU side)");
    auto gpu = GpuLock();
    return ev->CompileOnly(candidate);
  }

  StatusOr<CounterReport> Profile(const Candidate& candidate) override {
    CandidateEvaluator* ev = run_->o_->deps_.practice_evaluator;
    if (!ev) return FailedPrecondition("agent mode needs a practice evaluator (the GPU side)");
    auto gpu = GpuLock();
    std::vector<CounterReport> out = ev->ReadCounters({candidate});
    if (out.size() != 1) return Internal("the practice evaluator returned " + std::to_string(out.size()) + " reports");
    return std::move(out.front());
  }

  StatusOr<std::vector<store::AttemptRow>> StoredAttempts(const std::string& slot) override {
    return run_->store_->ListAttempts(run_->search_id_, slot);
  }

  Status StoreAttempt(const store::AttemptRow& attempt) override {
    return run_->store_->PutAttempt(attempt).status();
  }

 private:
  // The GPU's lock (SearchRun::practice_mu_) where the practice evaluator
  // shares this process's GPU with the judging one (it is also one caller at
  // a time). Without a judging evaluator here (GPU workers, issue 32), each
  // call is leased to a worker of its own: agents' calls go in parallel.
  std::unique_lock<std::mutex> GpuLock() {
    std::unique_lock<std::mutex> lock(run_->practice_mu_, std::defer_lock);
    if (run_->o_->deps_.evaluator) lock.lock();
    return lock;
  }

  SearchRun* const run_;
};

Status Orchestrator::SearchRun::AgentImplement(const IdeaRow& idea, std::optional<int64_t> parent, int branch,
                                               const RenderedPrompt& prompt, const std::string& slot) {
  AgentTask task;
  task.search_id = search_id_;
  task.idea_id = idea.id;
  task.slot = slot;
  task.system = prompt.system;
  task.prompt = prompt.user;
  task.signature = &problem_.signature;
  task.limits = {config_.agent_turns, config_.agent_tool_calls, config_.agent_tokens};
  task.profile = o_->deps_.practice_evaluator && o_->deps_.practice_evaluator->CanReadCounters();
  task.prompts = o_->deps_.prompts;  // the search's own prompt library (--prompts, the server's)
  AgentHostImpl host(this);
  StatusOr<AgentOutcome> ran = RunAgent(task, &host);
  // A tool call dropped because the search is stopping (a server's shutdown
  // or cancel while a GPU worker had the call, server/practice_calls.h): the
  // implementation is left unfinished, as a model turn refused would leave
  // it, and a resume runs that call again.
  if (!ran.ok() && ran.status().code() == Code::kCancelled && Cancelled()) return Status::Ok();
  KS_ASSIGN_OR_RETURN(AgentOutcome outcome, std::move(ran));
  CandidateRow c{.search_id = search_id_, .round = idea.round, .idea_id = idea.id, .parent_candidate = parent,
                 .kind = CandidateKind::kPrimary, .branch = branch, .slot_key = slot};
  if (outcome.stop == AgentStop::kAnswered) return StoreReply(c, outcome.final_text);  // no tools: a one-shot reply
  if (!outcome.candidate) return Status::Ok();  // refused or out of budget with nothing correct: no candidate
  KS_ASSIGN_OR_RETURN(auto existing, store_->FindCandidateBySlot(search_id_, slot));
  c.source = outcome.candidate->source;
  c.plan_json = outcome.candidate->plan_json;
  KS_ASSIGN_OR_RETURN(int64_t id, store_->PutCandidate(c));
  if (!existing) CandidateStored(id, idea.id, /*pending=*/true);
  return Status::Ok();
}

}  // namespace ks
