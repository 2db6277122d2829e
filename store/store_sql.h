// Internals shared by the lineage store's .cc files (not part of its surface:
// include store/lineage_store.h). A typed prepared statement, a write
// transaction, the schema's migrations, and the readers that turn a result row
// into a row struct, with the column lists they expect.
//
// The store's files, by concern: lineage_store.cc (opening, names, problems,
// searches, rounds, ideas), schema.cc (migrations), rows.cc (row readers),
// candidates.cc (candidates and evaluations), queries.cc (LLM calls, device
// facts, the kernel bank, suites).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "store/lineage_store.h"
#include "store/sqlite_handle.h"

namespace ks::store::internal {

// Ordered migrations: entry i takes a file from version i to version i + 1.
const std::vector<std::string>& Migrations();

inline constexpr const char* kNow = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

// A prepared statement with typed binding and column access. Columns and
// parameters are 1-based for binding (as SQLite), 0-based for reading.
class Stmt {
 public:
  Stmt(sqlite3* db, SqliteStmtPtr stmt) : db_(db), stmt_(std::move(stmt)) {}

  Stmt& Bind(int i, int64_t v) { return Check(sqlite3_bind_int64(stmt_.get(), i, v)); }
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Stmt& Bind(int i, double v) { return Check(sqlite3_bind_double(stmt_.get(), i, v)); }
  Stmt& Bind(int i, const std::string& v) {
    return Check(sqlite3_bind_text(stmt_.get(), i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Stmt& Bind(int i, const char* v) { return Bind(i, std::string(v)); }
  Stmt& BindNull(int i) { return Check(sqlite3_bind_null(stmt_.get(), i)); }
  template <typename T>
  Stmt& Bind(int i, const std::optional<T>& v) {
    return v ? Bind(i, *v) : BindNull(i);
  }

  // true: a row is ready; false: done.
  StatusOr<bool> Step() {
    if (!bind_status_.ok()) return bind_status_;
    int rc = sqlite3_step(stmt_.get());
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, std::string("running `") + Abbrev() + "`");
  }
  Status Run() {
    for (;;) {
      KS_ASSIGN_OR_RETURN(bool row, Step());
      if (!row) return Status::Ok();
    }
  }

  int64_t Int(int c) const { return sqlite3_column_int64(stmt_.get(), c); }
  double Real(int c) const { return sqlite3_column_double(stmt_.get(), c); }
  bool IsNull(int c) const { return sqlite3_column_type(stmt_.get(), c) == SQLITE_NULL; }
  std::string Text(int c) const {
    const unsigned char* p = sqlite3_column_text(stmt_.get(), c);
    int n = sqlite3_column_bytes(stmt_.get(), c);
    return p ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
  }
  std::optional<int64_t> OptInt(int c) const { return IsNull(c) ? std::nullopt : std::optional<int64_t>(Int(c)); }
  std::optional<double> OptReal(int c) const { return IsNull(c) ? std::nullopt : std::optional<double>(Real(c)); }

 private:
  Stmt& Check(int rc) {
    if (rc != SQLITE_OK && bind_status_.ok()) bind_status_ = SqliteError(db_, rc, "binding a parameter");
    return *this;
  }
  std::string Abbrev() const {
    std::string sql = sqlite3_sql(stmt_.get());
    return sql.size() > 60 ? sql.substr(0, 60) + "..." : sql;
  }
  sqlite3* db_;
  SqliteStmtPtr stmt_;
  Status bind_status_;
};

// BEGIN IMMEDIATE on construction (takes the write lock up front so that two
// writers never deadlock upgrading), ROLLBACK unless Commit() was called.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  Status Begin() {
    int rc = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, "beginning a transaction");
    open_ = true;
    return Status::Ok();
  }
  Status Commit() {
    int rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, "committing");
    open_ = false;
    return Status::Ok();
  }
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

 private:
  sqlite3* db_;
  bool open_ = false;
};

// A prepared statement `var` for `sql` on this store's connection (inside a
// LineageStore member, which holds mu_).
#define KS_STMT(var, sql)                     \
  KS_ASSIGN_OR_RETURN(auto var##_ptr, Prepare(sql)); \
  ::ks::store::internal::Stmt var(db_.get(), std::move(var##_ptr))

// The precision contract of the search under alias `s` (search/search_config.h
// `precision`; "fp32" where its config predates it). Identical candidates of a
// problem share one evaluation only under one contract: a kernel correct
// under tf32's wider tolerance is not thereby correct under fp32.
inline std::string SearchPrecision(const char* s) {
  return std::string("COALESCE(json_extract(") + s + ".config_json, '$.precision'), 'fp32')";
}

// Row readers: each reads the columns its k...Columns list selects, in order.
inline constexpr const char* kCandidateColumns =
    "c.id, c.search_id, c.round, c.idea_id, c.parent_candidate, c.source, c.plan_json, c.content_hash, "
    "c.state, c.raw_response, c.kind, c.branch, c.repair_depth, c.repair_attempted, c.slot_key, c.created, "
    "e.candidate_id, e.status, e.evaluation_json, e.median_ms, e.speedup_eager, e.speedup_compile, "
    "e.reused_from, e.created";
inline constexpr const char* kSearchColumns =
    "id, problem_id, config_json, status, stop_reason, created, updated, best_candidate, elapsed_s";
inline constexpr const char* kIdeaColumns = "id, search_id, round, parent_candidate, text, slot_key, created";
inline constexpr const char* kProblemColumns = "id, name, file_path, source, signature_json, sha256, created";
inline constexpr const char* kLlmCallColumns =
    "id, search_id, slot_key, prompt_sha256, role, backend, model, system, prompt, response, tokens_in, "
    "tokens_out, latency_s, cost_usd, error, finish_reason, attempts, created";

StatusOr<CandidateKind> ParseKind(const std::string& s);
StatusOr<CandidateRow> ReadCandidate(const Stmt& s);
StatusOr<std::vector<CandidateRow>> ReadCandidates(Stmt& s);
StatusOr<SearchRow> ReadSearch(const Stmt& s);
IdeaRow ReadIdea(const Stmt& s);
ProblemRow ReadProblem(const Stmt& s);
LlmCallRow ReadLlmCall(const Stmt& s);

}  // namespace ks::store::internal
