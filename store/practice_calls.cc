// The lineage store: agents' practice calls leased to remote GPU workers
// (issue 32). A call is a row of `practice_calls` (schema version 8): the
// server's agent puts it and waits; a worker leases it on a short lease,
// renews it (RenewLeases, store/leases.cc) while it runs, and completes it.
// A worker that dies stops renewing and the next one takes the call over.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "store/lineage_store.h"
#include "store/store_sql.h"

namespace ks::store {

using namespace internal;  // NOLINT: Stmt, Transaction, SearchPrecision

namespace {

constexpr const char* kPracticeColumns =
    "p.id, p.search_id, p.tool, p.source, p.plan_json, p.state, p.result_json, p.error, p.worker, p.attempts";

StatusOr<PracticeCallState> ParseState(const std::string& s) {
  if (s == "pending") return PracticeCallState::kPending;
  if (s == "done") return PracticeCallState::kDone;
  if (s == "failed") return PracticeCallState::kFailed;
  if (s == "abandoned") return PracticeCallState::kAbandoned;
  return Internal("practice call state '" + s + "' is unknown to this build");
}

StatusOr<PracticeCallRow> ReadPracticeCall(const Stmt& q) {
  PracticeCallRow r;
  r.id = q.Int(0);
  r.search_id = q.Int(1);
  KS_ASSIGN_OR_RETURN(r.tool, ParsePracticeTool(q.Text(2)));
  r.source = q.Text(3);
  r.plan_json = q.Text(4);
  KS_ASSIGN_OR_RETURN(r.state, ParseState(q.Text(5)));
  r.result_json = q.Text(6);
  r.error = q.Text(7);
  r.worker = q.Text(8);
  r.attempts = static_cast<int>(q.Int(9));
  return r;
}

}  // namespace

const char* PracticeToolName(PracticeTool t) {
  switch (t) {
    case PracticeTool::kCompile: return "compile";
    case PracticeTool::kTest: return "test";
    case PracticeTool::kProfile: return "profile";
  }
  return "test";
}

StatusOr<PracticeTool> ParsePracticeTool(const std::string& s) {
  if (s == "compile") return PracticeTool::kCompile;
  if (s == "test") return PracticeTool::kTest;
  if (s == "profile") return PracticeTool::kProfile;
  return InvalidArgument("practice tool '" + s + "': must be compile, test or profile");
}

StatusOr<int64_t> LineageStore::PutPracticeCall(int64_t search_id, PracticeTool tool, const std::string& source,
                                                const std::string& plan_json) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  {
    KS_STMT(q, "SELECT id FROM practice_calls WHERE state = 'pending' AND search_id = ? AND tool = ? AND source = ? "
               "AND plan_json = ? ORDER BY id LIMIT 1");
    q.Bind(1, search_id).Bind(2, PracticeToolName(tool)).Bind(3, source).Bind(4, plan_json);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) {
      int64_t id = q.Int(0);
      KS_RETURN_IF_ERROR(txn.Commit());
      return id;
    }
  }
  KS_STMT(ins, "INSERT INTO practice_calls (search_id, tool, source, plan_json) VALUES (?, ?, ?, ?)");
  ins.Bind(1, search_id).Bind(2, PracticeToolName(tool)).Bind(3, source).Bind(4, plan_json);
  KS_RETURN_IF_ERROR(ins.Run());
  int64_t id = sqlite3_last_insert_rowid(db_.get());
  KS_RETURN_IF_ERROR(txn.Commit());
  return id;
}

StatusOr<PracticeCallRow> LineageStore::GetPracticeCall(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kPracticeColumns + " FROM practice_calls p WHERE p.id = ?");
  q.Bind(1, id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return NotFound("no practice call with id " + std::to_string(id));
  return ReadPracticeCall(q);
}

StatusOr<std::vector<LeasedPracticeCallRow>> LineageStore::LeasePracticeCalls(const std::string& worker, int max,
                                                                             double lease_s, double now,
                                                                             bool reads_counters) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  std::vector<LeasedPracticeCallRow> found;
  {
    KS_STMT(q, std::string("SELECT ") + kPracticeColumns + ", s.problem_id, " + SearchPrecision("s") +
                   " FROM practice_calls p JOIN searches s ON s.id = p.search_id"
                   " WHERE p.state = 'pending' AND p.expires_at <= ?1"
                   " AND s.status NOT IN ('finished', 'cancelled', 'failed')"
                   " AND (?2 OR p.tool != 'profile') ORDER BY p.id LIMIT ?3");
    q.Bind(1, now).Bind(2, reads_counters ? 1 : 0).Bind(3, max + 16);
    for (;;) {
      KS_ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      LeasedPracticeCallRow l;
      KS_ASSIGN_OR_RETURN(l.call, ReadPracticeCall(q));
      l.problem_id = q.Int(10);
      l.precision = q.Text(11);
      found.push_back(std::move(l));
    }
  }
  std::vector<LeasedPracticeCallRow> out;
  for (auto& l : found) {
    if (static_cast<int>(out.size()) >= max) break;
    if (l.call.attempts >= kMaxPracticeAttempts) {
      // Its workers kept dying (or giving it back): the agent is told, not kept waiting.
      KS_STMT(f, "UPDATE practice_calls SET state = 'failed', error = ?, lease_id = NULL WHERE id = ?");
      f.Bind(1, "leased " + std::to_string(l.call.attempts) + " times to GPU workers without a result (the last: " +
                    l.call.worker + "); they died or gave it back")
          .Bind(2, l.call.id);
      KS_RETURN_IF_ERROR(f.Run());
      continue;
    }
    KS_STMT(up, "UPDATE practice_calls SET lease_id = lower(hex(randomblob(16))), worker = ?1, lease_s = ?2, "
                "expires_at = ?3, attempts = attempts + 1 WHERE id = ?4 RETURNING lease_id, attempts");
    up.Bind(1, worker).Bind(2, lease_s).Bind(3, now + lease_s).Bind(4, l.call.id);
    KS_ASSIGN_OR_RETURN(bool row, up.Step());
    if (!row) return Internal("leasing practice call " + std::to_string(l.call.id) + " returned nothing");
    l.lease_id = up.Text(0);
    l.call.attempts = static_cast<int>(up.Int(1));
    KS_RETURN_IF_ERROR(up.Run());
    l.call.worker = worker;
    l.expires_at = now + lease_s;
    out.push_back(std::move(l));
  }
  KS_RETURN_IF_ERROR(txn.Commit());
  return out;
}

Status LineageStore::CompletePracticeCall(int64_t id, const std::string& lease_id, const std::string& result_json,
                                          const std::string& error, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, "UPDATE practice_calls SET state = ?1, result_json = ?2, error = ?3, expires_at = ?4 "
             "WHERE id = ?5 AND lease_id = ?6 AND expires_at > ?4 AND state = 'pending'");
  u.Bind(1, error.empty() ? "done" : "failed").Bind(2, error.empty() ? result_json : "").Bind(3, error);
  u.Bind(4, now).Bind(5, id).Bind(6, lease_id);
  KS_RETURN_IF_ERROR(u.Run());
  if (sqlite3_changes(db_.get()) == 0)
    return FailedPrecondition("the lease of practice call " + std::to_string(id) +
                              " is not held (expired, released or already reported); its result is dropped");
  return Status::Ok();
}

Status LineageStore::AbandonPracticeCall(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, "UPDATE practice_calls SET state = 'abandoned' WHERE id = ? AND state = 'pending'");
  u.Bind(1, id);
  return u.Run();
}

}  // namespace ks::store
