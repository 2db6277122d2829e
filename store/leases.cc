// The lineage store: leases of pending candidates to remote GPU workers
// (kernelsearch gpu-worker; issue 13).
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/lineage_store.h"
#include "store/store_sql.h"

namespace ks::store {

using namespace internal;  // NOLINT: Stmt, Transaction, the readers and column lists

// ---- GPU worker leases (issue 13) ----

StatusOr<Evaluation> LineageStore::WithPolicyLocked(int64_t candidate_id, Evaluation evaluation) {
  if (!policy_) return evaluation;
  KS_STMT(q, "SELECT s.config_json FROM candidates c JOIN searches s ON s.id = c.search_id WHERE c.id = ?");
  q.Bind(1, candidate_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return NotFound("no candidate with id " + std::to_string(candidate_id));
  policy_(q.Text(0), evaluation);
  return evaluation;
}

Status LineageStore::CopyEvaluationLocked(int64_t to_candidate, int64_t from_candidate) {
  if (policy_) {
    // Another search's candidate may have been stored under another policy.
    KS_STMT(q, "SELECT evaluation_json FROM evaluations WHERE candidate_id = ?");
    q.Bind(1, from_candidate);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return Internal("candidate " + std::to_string(from_candidate) + " has no evaluation to copy");
    nlohmann::json j = nlohmann::json::parse(q.Text(0), nullptr, /*allow_exceptions=*/false);
    KS_ASSIGN_OR_RETURN(Evaluation stored, EvaluationFromJson(j));
    KS_ASSIGN_OR_RETURN(Evaluation e, WithPolicyLocked(to_candidate, std::move(stored)));
    return PutEvaluationLocked(to_candidate, e, from_candidate);
  }
  KS_STMT(ins, "INSERT INTO evaluations (candidate_id, status, evaluation_json, median_ms, speedup_eager, "
               "speedup_compile, reused_from) SELECT ?1, status, evaluation_json, median_ms, speedup_eager, "
               "speedup_compile, ?2 FROM evaluations WHERE candidate_id = ?2");
  ins.Bind(1, to_candidate).Bind(2, from_candidate);
  KS_RETURN_IF_ERROR(ins.Run());
  if (sqlite3_changes(db_.get()) == 0)
    return Internal("candidate " + std::to_string(from_candidate) + " has no evaluation to copy");
  KS_STMT(u, "UPDATE candidates SET state = 'evaluated' WHERE id = ?");
  u.Bind(1, to_candidate);
  KS_RETURN_IF_ERROR(u.Run());
  KS_STMT(d, "DELETE FROM leases WHERE candidate_id = ?");
  d.Bind(1, to_candidate);
  return d.Run();
}

StatusOr<std::vector<LeasedCandidateRow>> LineageStore::LeaseCandidates(const std::string& worker, int max,
                                                                       double lease_s, double now,
                                                                       int64_t prefer_problem) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  // Pending, not under a live lease, and no identical candidate of the same
  // problem under a live lease (it waits for that result instead).
  // (Identical: the same text of the same problem under the same precision contract.)
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns + ", s.problem_id, l.attempts, " + SearchPrecision("s") +
                 ", COALESCE(json_extract(s.config_json, '$.allow_degenerate'), 0)" +
                 " FROM candidates c LEFT JOIN evaluations e ON e.candidate_id = c.id"
                 " JOIN searches s ON s.id = c.search_id LEFT JOIN leases l ON l.candidate_id = c.id"
                 " WHERE c.state = 'pending' AND (l.candidate_id IS NULL OR l.expires_at <= ?1)"
                 " AND s.status NOT IN ('cancelled', 'failed')"
                 " AND NOT EXISTS (SELECT 1 FROM candidates c2 JOIN leases l2 ON l2.candidate_id = c2.id"
                 "   JOIN searches s2 ON s2.id = c2.search_id WHERE c2.content_hash = c.content_hash"
                 "   AND s2.problem_id = s.problem_id AND c2.id != c.id AND l2.expires_at > ?1 AND " +
                 SearchPrecision("s2") + " = " + SearchPrecision("s") + ")" +
                 " ORDER BY s.problem_id = ?2 DESC, c.id LIMIT 512");
  q.Bind(1, now).Bind(2, prefer_problem);
  struct Found {
    CandidateRow c;
    int64_t problem_id;
    int attempts;
    std::string precision;
    bool allow_degenerate;
  };
  std::vector<Found> found;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(q));
    found.push_back({std::move(c), q.Int(24), static_cast<int>(q.IsNull(25) ? 0 : q.Int(25)), q.Text(26), q.Int(27) != 0});
  }
  std::vector<LeasedCandidateRow> out;
  std::vector<std::tuple<int64_t, std::string, std::string>> taken;  // (problem, hash, precision) leased here
  for (auto& f : found) {
    if (static_cast<int>(out.size()) >= max) break;
    std::tuple<int64_t, std::string, std::string> key{f.problem_id, f.c.content_hash, f.precision};
    if (std::find(taken.begin(), taken.end(), key) != taken.end()) continue;
    {
      // Evaluated before (this search or another of the problem): copy, do not lease.
      KS_STMT(e, std::string("SELECT c.id FROM candidates c JOIN evaluations e ON e.candidate_id = c.id "
                             "JOIN searches s ON s.id = c.search_id WHERE c.content_hash = ? AND s.problem_id = ? "
                             "AND e.reused_from IS NULL AND ") +
                     SearchPrecision("s") + " = ? ORDER BY c.id LIMIT 1");
      e.Bind(1, f.c.content_hash).Bind(2, f.problem_id).Bind(3, f.precision);
      KS_ASSIGN_OR_RETURN(bool row, e.Step());
      if (row) {
        KS_RETURN_IF_ERROR(CopyEvaluationLocked(f.c.id, e.Int(0)));
        continue;
      }
    }
    KS_STMT(up, "INSERT INTO leases (candidate_id, lease_id, worker, expires_at) "
                "VALUES (?1, lower(hex(randomblob(16))), ?2, ?3) "
                "ON CONFLICT(candidate_id) DO UPDATE SET lease_id = excluded.lease_id, worker = excluded.worker, "
                "expires_at = excluded.expires_at, attempts = attempts + 1 RETURNING lease_id, attempts");
    up.Bind(1, f.c.id).Bind(2, worker).Bind(3, now + lease_s);
    KS_ASSIGN_OR_RETURN(bool row, up.Step());
    if (!row) return Internal("leasing candidate " + std::to_string(f.c.id) + " returned nothing");
    LeasedCandidateRow l;
    l.lease_id = up.Text(0);
    l.attempts = static_cast<int>(up.Int(1));
    KS_RETURN_IF_ERROR(up.Run());
    l.candidate = std::move(f.c);
    l.problem_id = f.problem_id;
    l.precision = f.precision;
    l.allow_degenerate = f.allow_degenerate;
    l.expires_at = now + lease_s;
    taken.push_back(key);
    out.push_back(std::move(l));
  }
  KS_RETURN_IF_ERROR(txn.Commit());
  return out;
}

StatusOr<std::vector<std::string>> LineageStore::RenewLeases(const std::vector<std::string>& lease_ids,
                                                             double lease_s, double now, bool release) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  std::vector<std::string> lost;
  for (const auto& id : lease_ids) {
    KS_STMT(u, "UPDATE leases SET expires_at = ?1 WHERE lease_id = ?2 AND expires_at > ?3");
    u.Bind(1, release ? now : now + lease_s).Bind(2, id).Bind(3, now);
    KS_RETURN_IF_ERROR(u.Run());
    if (sqlite3_changes(db_.get()) > 0) continue;
    // An agent's practice call (store/practice_calls.cc): renewed by the
    // (short) length it was leased for, so that a dead worker's call moves on soon.
    KS_STMT(p, "UPDATE practice_calls SET expires_at = CASE WHEN ?1 THEN ?2 ELSE ?2 + lease_s END "
               "WHERE lease_id = ?3 AND expires_at > ?2 AND state = 'pending'");
    p.Bind(1, release ? 1 : 0).Bind(2, now).Bind(3, id);
    KS_RETURN_IF_ERROR(p.Run());
    if (sqlite3_changes(db_.get()) == 0) lost.push_back(id);
  }
  KS_RETURN_IF_ERROR(txn.Commit());
  return lost;
}

StatusOr<LineageStore::LeaseCompletion> LineageStore::CompleteLease(int64_t candidate_id, const std::string& lease_id,
                                                           const Evaluation& evaluation, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  int64_t problem_id = 0;
  int64_t search_id = 0;
  std::string hash, precision;
  {
    KS_STMT(q, "SELECT s.problem_id, c.search_id, c.content_hash, " + SearchPrecision("s") +
                   " FROM leases l JOIN candidates c ON c.id = l.candidate_id JOIN searches s ON s.id = c.search_id"
                   " WHERE l.candidate_id = ? AND l.lease_id = ? AND l.expires_at > ? AND c.state = 'pending'");
    q.Bind(1, candidate_id).Bind(2, lease_id).Bind(3, now);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row)
      return FailedPrecondition("the lease of candidate " + std::to_string(candidate_id) +
                                " is not held (expired, released or already reported); its result is dropped");
    problem_id = q.Int(0);
    search_id = q.Int(1);
    hash = q.Text(2);
    precision = q.Text(3);
  }
  KS_ASSIGN_OR_RETURN(Evaluation e, WithPolicyLocked(candidate_id, evaluation));
  KS_RETURN_IF_ERROR(PutEvaluationLocked(candidate_id, e, std::nullopt));  // ends the lease
  std::vector<int64_t> searches = {search_id};
  std::vector<std::pair<int64_t, int64_t>> twins;  // (candidate, search)
  {
    KS_STMT(q, "SELECT c.id, c.search_id FROM candidates c JOIN searches s ON s.id = c.search_id "
               "LEFT JOIN leases l ON l.candidate_id = c.id WHERE c.state = 'pending' AND c.content_hash = ? "
               "AND s.problem_id = ? AND (l.candidate_id IS NULL OR l.expires_at <= ?) AND " +
                   SearchPrecision("s") + " = ? ORDER BY c.id");
    q.Bind(1, hash).Bind(2, problem_id).Bind(3, now).Bind(4, precision);
    for (;;) {
      KS_ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      twins.emplace_back(q.Int(0), q.Int(1));
    }
  }
  for (const auto& [twin, twin_search] : twins) {
    KS_RETURN_IF_ERROR(CopyEvaluationLocked(twin, candidate_id));
    if (std::find(searches.begin(), searches.end(), twin_search) == searches.end()) searches.push_back(twin_search);
  }
  KS_RETURN_IF_ERROR(txn.Commit());
  return LeaseCompletion{.stored = 1 + static_cast<int64_t>(twins.size()), .searches = std::move(searches)};
}

Status LineageStore::RefuseLease(int64_t candidate_id, const std::string& lease_id, const std::string& reason,
                                 double now, int64_t* search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  {
    KS_STMT(q, "SELECT c.search_id FROM leases l JOIN candidates c ON c.id = l.candidate_id WHERE l.candidate_id = ? "
               "AND l.lease_id = ? AND l.expires_at > ? AND c.state = 'pending'");
    q.Bind(1, candidate_id).Bind(2, lease_id).Bind(3, now);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row)
      return FailedPrecondition("the lease of candidate " + std::to_string(candidate_id) +
                                " is not held (expired, released or already reported)");
    *search_id = q.Int(0);
  }
  KS_STMT(u, std::string("UPDATE searches SET status = 'failed', stop_reason = ?, updated = ") + kNow +
                 " WHERE id = ? AND status NOT IN ('finished', 'cancelled')");
  u.Bind(1, reason).Bind(2, *search_id);
  KS_RETURN_IF_ERROR(u.Run());
  KS_STMT(d, "DELETE FROM leases WHERE candidate_id = ?");
  d.Bind(1, candidate_id);
  KS_RETURN_IF_ERROR(d.Run());
  return txn.Commit();
}

StatusOr<std::pair<int64_t, int64_t>> LineageStore::PendingAndLeased(int64_t search_id, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT COUNT(*), COUNT(l.candidate_id) FROM candidates c LEFT JOIN leases l ON "
             "l.candidate_id = c.id AND l.expires_at > ?2 WHERE c.state = 'pending' AND (?1 = 0 OR c.search_id = ?1)");
  q.Bind(1, search_id).Bind(2, now);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::pair<int64_t, int64_t>{0, 0};
  return std::pair<int64_t, int64_t>{q.Int(0), q.Int(1)};
}


}  // namespace ks::store
