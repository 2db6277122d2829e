#include "search/call_ledger.h"

namespace ks {

StatusOr<std::optional<std::string>> CallLedger::StoredResponse(const LedgerEntry& entry) {
  KS_ASSIGN_OR_RETURN(auto found, store_->FindFinishedLlmCall(search_id_, entry.role, entry.prompt_hash, entry.slot));
  if (!found) return std::optional<std::string>();
  return std::optional<std::string>(std::move(found->record.response));
}

Status CallLedger::Record(const LedgerEntry& entry, const Status& status, LlmCallRecord* record) {
  if (record->role.empty()) record->role = entry.role;
  if (!status.ok() && record->error.empty()) record->error = status.ToString();
  if (status.ok()) record->error.clear();
  KS_RETURN_IF_ERROR(store_->PutLlmCall(search_id_, entry.slot, *record).status());
  return budget_->CallRecorded(entry.role, status, entry.first_pass, *record);
}

}  // namespace ks
