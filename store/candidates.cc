// The lineage store: candidates and their evaluations, the lineage of a
// candidate, the best correct ones.
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/lineage_store.h"
#include "store/store_sql.h"
#include "store/candidate_hash.h"

namespace ks::store {

using namespace internal;  // NOLINT: Stmt, Transaction, the readers and column lists

// ---- candidates ----

StatusOr<int64_t> LineageStore::PutCandidate(const CandidateRow& candidate) {
  if (candidate.slot_key.empty()) return InvalidArgument("a candidate needs a slot key");
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  KS_ASSIGN_OR_RETURN(int64_t id, PutCandidateLocked(candidate));
  KS_RETURN_IF_ERROR(txn.Commit());
  return id;
}

StatusOr<int64_t> LineageStore::PutCandidateLocked(const CandidateRow& c) {
  std::string hash = c.content_hash.empty() ? CandidateContentHash(c.source, c.plan_json) : c.content_hash;
  {
    KS_STMT(ins, "INSERT INTO candidates (search_id, round, idea_id, parent_candidate, source, plan_json, "
                 "content_hash, state, raw_response, kind, branch, repair_depth, slot_key) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?) "
                 "ON CONFLICT(search_id, slot_key) DO NOTHING");
    ins.Bind(1, c.search_id).Bind(2, c.round).Bind(3, c.idea_id).Bind(4, c.parent_candidate).Bind(5, c.source)
        .Bind(6, c.plan_json).Bind(7, hash).Bind(8, c.raw_response).Bind(9, CandidateKindName(c.kind))
        .Bind(10, c.branch).Bind(11, c.repair_depth).Bind(12, c.slot_key);
    KS_RETURN_IF_ERROR(ins.Run());
  }
  KS_STMT(q, "SELECT id FROM candidates WHERE search_id = ? AND slot_key = ?");
  q.Bind(1, c.search_id).Bind(2, c.slot_key);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return Internal("candidate row vanished after insert");
  return q.Int(0);
}

StatusOr<CandidateRow> LineageStore::GetCandidate(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c LEFT JOIN evaluations e ON e.candidate_id = c.id WHERE c.id = ?");
  q.Bind(1, id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return NotFound("no candidate with id " + std::to_string(id));
  return ReadCandidate(q);
}

StatusOr<std::optional<CandidateRow>> LineageStore::FindCandidateBySlot(int64_t search_id,
                                                                        const std::string& slot_key) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c LEFT JOIN evaluations e ON e.candidate_id = c.id "
                 "WHERE c.search_id = ? AND c.slot_key = ?");
  q.Bind(1, search_id).Bind(2, slot_key);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<CandidateRow>();
  KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(q));
  return std::optional<CandidateRow>(std::move(c));
}

StatusOr<std::vector<CandidateRow>> LineageStore::ListCandidates(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c LEFT JOIN evaluations e ON e.candidate_id = c.id "
                 "WHERE c.search_id = ? ORDER BY c.id");
  q.Bind(1, search_id);
  return ReadCandidates(q);
}

StatusOr<std::vector<CandidateRow>> LineageStore::PendingCandidates(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c LEFT JOIN evaluations e ON e.candidate_id = c.id "
                 "WHERE c.state = 'pending' AND (?1 = 0 OR c.search_id = ?1) ORDER BY c.id");
  q.Bind(1, search_id);
  return ReadCandidates(q);
}

Status LineageStore::MarkRepairAttempted(int64_t candidate_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, "UPDATE candidates SET repair_attempted = 1 WHERE id = ?");
  u.Bind(1, candidate_id);
  return u.Run();
}

StatusOr<std::vector<CandidateRow>> LineageStore::Lineage(int64_t candidate_id) {
  std::vector<CandidateRow> path;
  std::optional<int64_t> next = candidate_id;
  while (next) {
    // Parent ids are always smaller than their children's (a parent exists
    // before its child is inserted), so this walk ends; the check guards
    // against a hand-edited file.
    if (!path.empty() && *next >= path.back().id)
      return Internal("lineage of candidate " + std::to_string(candidate_id) + " has a cycle");
    KS_ASSIGN_OR_RETURN(CandidateRow c, GetCandidate(*next));
    next = c.parent_candidate;
    path.push_back(std::move(c));
  }
  return std::vector<CandidateRow>(path.rbegin(), path.rend());
}

// ---- evaluations ----

Status LineageStore::PutEvaluation(int64_t candidate_id, const Evaluation& evaluation,
                                   std::optional<int64_t> reused_from) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  KS_RETURN_IF_ERROR(PutEvaluationLocked(candidate_id, evaluation, reused_from));
  return txn.Commit();
}

StatusOr<bool> LineageStore::WantsCounters(int64_t candidate_id) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t search = 0, round = 0, top = 0;
  double median = 0;
  {
    KS_STMT(q, "SELECT c.search_id, c.round, COALESCE(json_extract(s.config_json, '$.profile_top'), 1), e.median_ms "
               "FROM candidates c JOIN evaluations e ON e.candidate_id = c.id JOIN searches s ON s.id = c.search_id "
               "WHERE c.id = ? AND e.status = 'correct' AND e.median_ms IS NOT NULL "
               "AND json_extract(e.evaluation_json, '$.counters') IS NULL");
    q.Bind(1, candidate_id);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return false;
    search = q.Int(0);
    round = q.Int(1);
    top = q.Int(2);
    median = q.Real(3);
  }
  if (top <= 0) return false;
  KS_STMT(q, "SELECT COUNT(*) FROM candidates c JOIN evaluations e ON e.candidate_id = c.id WHERE c.search_id = ? "
             "AND c.round = ? AND e.status = 'correct' AND e.median_ms < ? AND c.id != ?");
  q.Bind(1, search).Bind(2, round).Bind(3, median).Bind(4, candidate_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  return row && q.Int(0) < top;
}

Status LineageStore::SetEvaluationCounters(int64_t candidate_id, const nlohmann::json& counters) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  std::string text;
  {
    KS_STMT(q, "SELECT evaluation_json FROM evaluations WHERE candidate_id = ?");
    q.Bind(1, candidate_id);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return NotFound("no evaluation of candidate " + std::to_string(candidate_id));
    text = q.Text(0);
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return Internal("the stored evaluation of candidate " + std::to_string(candidate_id) + " is not JSON");
  j["counters"] = counters;
  {
    KS_STMT(u, "UPDATE evaluations SET evaluation_json = ? WHERE candidate_id = ?");
    u.Bind(1, j.dump()).Bind(2, candidate_id);
    KS_RETURN_IF_ERROR(u.Run());
  }
  return txn.Commit();
}

Status LineageStore::PutEvaluationLocked(int64_t candidate_id, const Evaluation& evaluation,
                                         std::optional<int64_t> reused_from) {
  {
    KS_STMT(ins, "INSERT INTO evaluations (candidate_id, status, evaluation_json, median_ms, speedup_eager, "
                 "speedup_compile, reused_from) VALUES (?, ?, ?, ?, ?, ?, ?)");
    std::optional<double> median;
    if (evaluation.timing) median = evaluation.timing->median_ms;
    ins.Bind(1, candidate_id).Bind(2, EvalStatusName(evaluation.status))
        .Bind(3, EvaluationToJson(evaluation).dump()).Bind(4, median).Bind(5, evaluation.speedup_eager)
        .Bind(6, evaluation.speedup_compile).Bind(7, reused_from);
    Status st = ins.Run();
    if (!st.ok()) return st.WithContext("storing the evaluation of candidate " + std::to_string(candidate_id));
  }
  {
    KS_STMT(u, "UPDATE candidates SET state = 'evaluated' WHERE id = ?");
    u.Bind(1, candidate_id);
    KS_RETURN_IF_ERROR(u.Run());
    if (sqlite3_changes(db_.get()) == 0) return NotFound("no candidate with id " + std::to_string(candidate_id));
  }
  {
    // An evaluated candidate holds no lease (whoever evaluated it: a worker,
    // evaluate-pending, a local search); a late report under one is refused.
    KS_STMT(d, "DELETE FROM leases WHERE candidate_id = ?");
    d.Bind(1, candidate_id);
    KS_RETURN_IF_ERROR(d.Run());
  }
  return Status::Ok();
}

StatusOr<std::optional<CandidateRow>> LineageStore::FindEvaluatedByHash(int64_t problem_id,
                                                                        const std::string& content_hash,
                                                                        const std::string& precision) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c JOIN evaluations e ON e.candidate_id = c.id "
                 "JOIN searches s ON s.id = c.search_id "
                 "WHERE c.content_hash = ? AND s.problem_id = ? AND e.reused_from IS NULL AND " +
                 SearchPrecision("s") + " = ? ORDER BY c.id LIMIT 1");
  q.Bind(1, content_hash).Bind(2, problem_id).Bind(3, precision);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<CandidateRow>();
  KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(q));
  return std::optional<CandidateRow>(std::move(c));
}

// Robust kernels first (issue 27): a kernel that a distribution-shifted input
// set broke (the evaluation's robustness.specialised) ranks after every
// robust one, however fast, so that the best kernel is one that holds.
constexpr const char* kSpecialisedLast =
    "COALESCE(json_extract(e.evaluation_json, '$.robustness.specialised'), 0)";

StatusOr<std::vector<CandidateRow>> LineageStore::CorrectCandidates(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c JOIN evaluations e ON e.candidate_id = c.id "
                 "WHERE c.search_id = ? AND e.status = 'correct' "
                 "ORDER BY e.median_ms IS NULL, " + kSpecialisedLast + ", e.median_ms, c.id");
  q.Bind(1, search_id);
  return ReadCandidates(q);
}

StatusOr<std::optional<CandidateRow>> LineageStore::BestCorrect(int64_t search_id) {
  KS_ASSIGN_OR_RETURN(auto all, CorrectCandidates(search_id));
  if (all.empty()) return std::optional<CandidateRow>();
  return std::optional<CandidateRow>(std::move(all.front()));
}

StatusOr<std::optional<CandidateRow>> LineageStore::BestCorrectForProblem(int64_t problem_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c JOIN evaluations e ON e.candidate_id = c.id "
                 "JOIN searches s ON s.id = c.search_id "
                 "WHERE s.problem_id = ? AND e.status = 'correct' "
                 "ORDER BY e.median_ms IS NULL, " + kSpecialisedLast + ", e.median_ms, c.id LIMIT 1");
  q.Bind(1, problem_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<CandidateRow>();
  KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(q));
  return std::optional<CandidateRow>(std::move(c));
}

}  // namespace ks::store
