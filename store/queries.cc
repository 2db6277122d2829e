// The lineage store: LLM calls, device facts, the kernel bank and suites.
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/lineage_store.h"
#include "store/store_sql.h"

namespace ks::store {

using namespace internal;  // NOLINT: Stmt, Transaction, the readers and column lists

// ---- LLM calls ----

StatusOr<int64_t> LineageStore::PutLlmCall(int64_t search_id, const std::string& slot_key,
                                           const LlmCallRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(ins, "INSERT INTO llm_calls (search_id, role, backend, model, prompt, response, tokens_in, tokens_out, "
               "latency_s, cost_usd, error, finish_reason, attempts, system, slot_key, prompt_sha256) "
               "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  ins.Bind(1, search_id).Bind(2, r.role).Bind(3, r.backend).Bind(4, r.model).Bind(5, r.prompt).Bind(6, r.response)
      .Bind(7, r.tokens_in).Bind(8, r.tokens_out).Bind(9, r.latency_s).Bind(10, r.cost_usd).Bind(11, r.error)
      .Bind(12, r.finish_reason).Bind(13, r.attempts).Bind(14, r.system).Bind(15, slot_key)
      .Bind(16, PromptHash(r.role, r.system, r.prompt));
  KS_RETURN_IF_ERROR(ins.Run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_.get()));
}

StatusOr<std::optional<LlmCallRow>> LineageStore::FindFinishedLlmCall(int64_t search_id, const std::string& role,
                                                                      const std::string& prompt_sha256,
                                                                      const std::string& slot_key) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kLlmCallColumns +
                 " FROM llm_calls WHERE search_id = ? AND role = ? AND prompt_sha256 = ? AND slot_key = ? "
                 "AND error = '' ORDER BY id LIMIT 1");
  q.Bind(1, search_id).Bind(2, role).Bind(3, prompt_sha256).Bind(4, slot_key);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<LlmCallRow>();
  return std::optional<LlmCallRow>(ReadLlmCall(q));
}

StatusOr<std::vector<LlmCallRow>> LineageStore::ListLlmCalls(int64_t search_id, bool finished_only) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kLlmCallColumns +
                 " FROM llm_calls WHERE search_id = ? AND (? = 0 OR error = '') ORDER BY id");
  q.Bind(1, search_id).Bind(2, finished_only ? 1 : 0);
  std::vector<LlmCallRow> out;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return out;
    out.push_back(ReadLlmCall(q));
  }
}

StatusOr<LlmSpend> LineageStore::Spend(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT COUNT(*), COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0), "
             "COALESCE(SUM(cost_usd), 0) FROM llm_calls WHERE search_id = ?");
  q.Bind(1, search_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  LlmSpend s;
  if (row) {
    s.calls = q.Int(0);
    s.tokens_in = q.Int(1);
    s.tokens_out = q.Int(2);
    s.cost_usd = q.Real(3);
  }
  return s;
}

// ---- device facts ----

Status LineageStore::PutGpuFacts(const std::string& name, const std::string& facts_json,
                                 std::optional<int64_t> search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(ins, "INSERT INTO gpu_facts (name, facts_json, search_id) VALUES (?, ?, ?)");
  ins.Bind(1, name).Bind(2, facts_json);
  if (search_id) ins.Bind(3, *search_id);
  return ins.Run();
}

StatusOr<std::optional<std::string>> LineageStore::LatestGpuFacts(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT facts_json FROM gpu_facts WHERE name = ? ORDER BY id DESC LIMIT 1");
  q.Bind(1, name);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(q.Text(0));
}

StatusOr<std::optional<std::string>> LineageStore::LatestGpuFactsForSearch(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT facts_json FROM gpu_facts WHERE search_id = ? ORDER BY id DESC LIMIT 1");
  q.Bind(1, search_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(q.Text(0));
}

// ---- the kernel bank ----

StatusOr<std::vector<BankEntry>> LineageStore::BankCandidates(int64_t exclude_problem_id) {
  std::vector<std::pair<int64_t, ProblemRow>> problems;
  {
    std::lock_guard<std::mutex> lock(mu_);
    KS_STMT(q, "SELECT id, name, source FROM problems WHERE id != ? ORDER BY id");
    q.Bind(1, exclude_problem_id);
    for (;;) {
      KS_ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      ProblemRow p;
      p.id = q.Int(0);
      p.name = q.Text(1);
      p.source = q.Text(2);
      problems.push_back({p.id, std::move(p)});
    }
  }
  std::vector<BankEntry> out;
  for (auto& [id, p] : problems) {
    KS_ASSIGN_OR_RETURN(auto best, BestCorrectForProblem(id));
    if (!best) continue;
    out.push_back(BankEntry{std::move(p), std::move(*best)});
  }
  return out;
}

Status LineageStore::RecordBankShown(int64_t search_id, const std::string& slot_key,
                                     const std::vector<int64_t>& bank_candidates) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t c : bank_candidates) {
    KS_STMT(ins, "INSERT OR IGNORE INTO bank_shown (search_id, slot_key, bank_candidate) VALUES (?, ?, ?)");
    ins.Bind(1, search_id).Bind(2, slot_key).Bind(3, c);
    KS_RETURN_IF_ERROR(ins.Run());
  }
  return Status::Ok();
}

StatusOr<std::vector<std::pair<std::string, int64_t>>> LineageStore::ListBankShown(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT slot_key, bank_candidate FROM bank_shown WHERE search_id = ? ORDER BY slot_key, bank_candidate");
  q.Bind(1, search_id);
  std::vector<std::pair<std::string, int64_t>> out;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    out.push_back({q.Text(0), q.Int(1)});
  }
  return out;
}

StatusOr<int64_t> LineageStore::FailedLlmCalls(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT COUNT(*) FROM llm_calls WHERE search_id = ? AND error != ''");
  q.Bind(1, search_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  return row ? q.Int(0) : int64_t{0};
}

StatusOr<int64_t> LineageStore::CreateSuite(const std::string& config_json, const std::vector<std::string>& files) {
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  KS_STMT(ins, "INSERT INTO suites (config_json, status) VALUES (?, 'pending')");
  ins.Bind(1, config_json);
  KS_RETURN_IF_ERROR(ins.Run());
  int64_t id = sqlite3_last_insert_rowid(db_.get());
  for (size_t i = 0; i < files.size(); ++i) {
    KS_STMT(e, "INSERT INTO suite_problems (suite_id, position, file_path) VALUES (?, ?, ?)");
    e.Bind(1, id).Bind(2, static_cast<int64_t>(i)).Bind(3, files[i]);
    KS_RETURN_IF_ERROR(e.Run());
  }
  KS_RETURN_IF_ERROR(txn.Commit());
  return id;
}

StatusOr<SuiteRow> LineageStore::GetSuite(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  SuiteRow suite;
  {
    KS_STMT(q, "SELECT id, config_json, status, created, updated FROM suites WHERE id = ?");
    q.Bind(1, id);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return NotFound("no suite with id " + std::to_string(id));
    suite.id = q.Int(0);
    suite.config_json = q.Text(1);
    KS_ASSIGN_OR_RETURN(suite.status, ParseSearchStatus(q.Text(2)));
    suite.created = q.Text(3);
    suite.updated = q.Text(4);
  }
  KS_STMT(q, "SELECT position, file_path, search_id, error FROM suite_problems WHERE suite_id = ? ORDER BY position");
  q.Bind(1, id);
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    suite.entries.push_back({.position = static_cast<int>(q.Int(0)), .file_path = q.Text(1),
                             .search_id = q.OptInt(2), .error = q.Text(3)});
  }
  return suite;
}

Status LineageStore::SetSuiteEntry(int64_t suite_id, int position, std::optional<int64_t> search_id,
                                   const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, "UPDATE suite_problems SET search_id = ?, error = ? WHERE suite_id = ? AND position = ?");
  u.Bind(1, search_id).Bind(2, error).Bind(3, suite_id).Bind(4, static_cast<int64_t>(position));
  KS_RETURN_IF_ERROR(u.Run());
  if (sqlite3_changes(db_.get()) == 0)
    return NotFound("suite " + std::to_string(suite_id) + " has no problem " + std::to_string(position));
  return Status::Ok();
}

Status LineageStore::SetSuiteStatus(int64_t id, SearchStatus status) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, std::string("UPDATE suites SET status = ?, updated = ") + kNow + " WHERE id = ?");
  u.Bind(1, SearchStatusName(status)).Bind(2, id);
  KS_RETURN_IF_ERROR(u.Run());
  if (sqlite3_changes(db_.get()) == 0) return NotFound("no suite with id " + std::to_string(id));
  return Status::Ok();
}

}  // namespace ks::store
