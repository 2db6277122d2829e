// The ledger of a search's model calls: the one path every call takes, the
// one-shot ideas/implement/repair calls and an agent's turns alike. A call is
// kept in the lineage store under its slot key (search/slot_key.h) and its
// prompt's hash, so that a resumed search finds a finished call again and
// reuses its reply rather than paying for it twice. The budgets are the
// owner's (CallBudget): the ledger asks before every new call and reports
// every call it stores.
// Borrows the store and the budget, which outlive it; thread-safe when the
// budget is (the store is).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"
#include "llm/llm_client.h"
#include "store/lineage_store.h"

namespace ks {

// What the ledger needs of the search's budgets (Orchestrator::SearchRun).
class CallBudget {
 public:
  virtual ~CallBudget() = default;
  // A new call may go out: false, and *refused when given, when a budget is
  // spent or the search is stopping. A first-pass call refused leaves its
  // round unfinished.
  virtual bool ReserveCall(bool first_pass, bool* refused) = 0;
  // A finished call's stored reply was reused: no new call.
  virtual void CallReused() = 0;
  // A new call ended with `status` and is stored: adds up its spend.
  virtual Status CallRecorded(const std::string& role, const Status& status, bool first_pass,
                              const LlmCallRecord& record) = 0;
};

// Where a call goes in the ledger, and how the budget treats it.
struct LedgerEntry {
  std::string role;         // "ideas", "implement", "repair"
  std::string slot;         // a SlotKey's Format()
  std::string prompt_hash;  // store::PromptHash of the role, system and prompt as stored
  bool first_pass = true;   // a call of the round's first pass (not a repair)
  bool* refused = nullptr;  // set when the budget refuses the call; may be null
};

class CallLedger {
 public:
  CallLedger(store::LineageStore* store, int64_t search_id, CallBudget* budget)
      : store_(store), search_id_(search_id), budget_(budget) {}
  CallLedger(const CallLedger&) = delete;
  CallLedger& operator=(const CallLedger&) = delete;

  // The reply of the call at `entry`: a finished call stored there before,
  // read back by `reuse` from its stored response; otherwise, when the budget
  // allows, `make` calls the model (filling the record) and the call is stored
  // with its status. nullopt when the budget refused the call or it failed
  // (stored with its error). Errors: the store failing, `reuse` failing.
  template <typename Reply>
  StatusOr<std::optional<Reply>> Call(const LedgerEntry& entry,
                                      const std::function<StatusOr<Reply>(LlmCallRecord*)>& make,
                                      const std::function<StatusOr<Reply>(const std::string&)>& reuse) {
    KS_ASSIGN_OR_RETURN(std::optional<std::string> stored, StoredResponse(entry));
    if (stored) {  // a resumed search: this call was paid for already
      KS_ASSIGN_OR_RETURN(Reply reply, reuse(*stored));
      budget_->CallReused();
      return std::optional<Reply>(std::move(reply));
    }
    if (!budget_->ReserveCall(entry.first_pass, entry.refused)) return std::optional<Reply>();
    LlmCallRecord record;
    StatusOr<Reply> reply = make(&record);
    KS_RETURN_IF_ERROR(Record(entry, reply.status(), &record));
    if (!reply.ok()) return std::optional<Reply>();
    return std::optional<Reply>(std::move(*reply));
  }

 private:
  // The response of the finished call stored at `entry`, if any.
  StatusOr<std::optional<std::string>> StoredResponse(const LedgerEntry& entry);
  // Stores a new call (its record completed with the role and error) and tells the budget.
  Status Record(const LedgerEntry& entry, const Status& status, LlmCallRecord* record);

  store::LineageStore* const store_;
  const int64_t search_id_;
  CallBudget* const budget_;
};

}  // namespace ks
