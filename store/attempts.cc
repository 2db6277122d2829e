// The lineage store: an agent's attempts, the tool calls of its conversation
// (search/agent.h) with what each was answered.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "store/lineage_store.h"
#include "store/store_sql.h"

namespace ks::store {

using namespace internal;  // NOLINT: Stmt, Transaction

namespace {

constexpr char kAttemptColumns[] =
    "id, search_id, idea_id, slot_key, turn, call_index, tool_call_id, tool, arguments, source, plan_json, "
    "status, is_error, result, evaluation_json, candidate_id, created";

AttemptRow ReadAttempt(const Stmt& q) {
  AttemptRow a;
  a.id = q.Int(0);
  a.search_id = q.Int(1);
  if (!q.IsNull(2)) a.idea_id = q.Int(2);
  a.slot_key = q.Text(3);
  a.turn = static_cast<int>(q.Int(4));
  a.call_index = static_cast<int>(q.Int(5));
  a.tool_call_id = q.Text(6);
  a.tool = q.Text(7);
  a.arguments = q.Text(8);
  a.source = q.Text(9);
  a.plan_json = q.Text(10);
  a.status = q.Text(11);
  a.is_error = q.Int(12) != 0;
  a.result = q.Text(13);
  a.evaluation_json = q.Text(14);
  if (!q.IsNull(15)) a.candidate_id = q.Int(15);
  a.created = q.Text(16);
  return a;
}

}  // namespace

StatusOr<int64_t> LineageStore::PutAttempt(const AttemptRow& a) {
  if (a.slot_key.empty()) return InvalidArgument("an attempt needs its implementation's slot key");
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  {
    KS_STMT(ins, "INSERT INTO attempts (search_id, idea_id, slot_key, turn, call_index, tool_call_id, tool, "
                 "arguments, source, plan_json, status, is_error, result, evaluation_json, candidate_id) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                 "ON CONFLICT(search_id, slot_key, turn, call_index) DO NOTHING");
    ins.Bind(1, a.search_id).Bind(2, a.idea_id).Bind(3, a.slot_key).Bind(4, a.turn).Bind(5, a.call_index)
        .Bind(6, a.tool_call_id).Bind(7, a.tool).Bind(8, a.arguments).Bind(9, a.source).Bind(10, a.plan_json)
        .Bind(11, a.status).Bind(12, a.is_error ? 1 : 0).Bind(13, a.result).Bind(14, a.evaluation_json)
        .Bind(15, a.candidate_id);
    KS_RETURN_IF_ERROR(ins.Run());
  }
  KS_STMT(q, "SELECT id FROM attempts WHERE search_id = ? AND slot_key = ? AND turn = ? AND call_index = ?");
  q.Bind(1, a.search_id).Bind(2, a.slot_key).Bind(3, a.turn).Bind(4, a.call_index);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return Internal("attempt row vanished after insert");
  int64_t id = q.Int(0);
  KS_RETURN_IF_ERROR(txn.Commit());
  return id;
}

StatusOr<std::vector<AttemptRow>> LineageStore::ListAttempts(int64_t search_id, const std::string& slot_key) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kAttemptColumns +
                 " FROM attempts WHERE search_id = ? AND (? = '' OR slot_key = ?) ORDER BY slot_key, turn, call_index");
  q.Bind(1, search_id).Bind(2, slot_key).Bind(3, slot_key);
  std::vector<AttemptRow> out;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return out;
    out.push_back(ReadAttempt(q));
  }
}

StatusOr<AttemptCounts> LineageStore::CountAttempts(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT COUNT(*), COALESCE(SUM(is_error), 0), "
             "COALESCE(SUM(CASE WHEN evaluation_json != '' THEN 1 ELSE 0 END), 0), "
             "COALESCE(SUM(CASE WHEN tool = 'submit' AND is_error = 0 THEN 1 ELSE 0 END), 0) "
             "FROM attempts WHERE search_id = ?");
  q.Bind(1, search_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  AttemptCounts c;
  if (row) c = {q.Int(0), q.Int(1), q.Int(2), q.Int(3)};
  return c;
}

}  // namespace ks::store
