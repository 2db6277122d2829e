#include "search/store/lineage_store.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "search/store/candidate_hash.h"

namespace ks::store {
namespace {

// Ordered migrations: entry i takes a file from version i to version i + 1. Never
// edit a step that has shipped; append a new one.
const std::vector<std::string>& Migrations() {
  static const std::vector<std::string> kSteps = {
      // 1: the tables of DESIGN.md.
      R"sql(
CREATE TABLE problems (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  file_path TEXT NOT NULL,
  source TEXT NOT NULL,
  signature_json TEXT NOT NULL DEFAULT '{}',
  sha256 TEXT NOT NULL UNIQUE,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE searches (
  id INTEGER PRIMARY KEY,
  problem_id INTEGER NOT NULL REFERENCES problems(id),
  config_json TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'finished', 'cancelled', 'failed')),
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  updated TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  best_candidate INTEGER
);
CREATE TABLE ideas (
  id INTEGER PRIMARY KEY,
  search_id INTEGER NOT NULL REFERENCES searches(id),
  round INTEGER NOT NULL,
  parent_candidate INTEGER,
  text TEXT NOT NULL,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE candidates (
  id INTEGER PRIMARY KEY,
  search_id INTEGER NOT NULL REFERENCES searches(id),
  round INTEGER NOT NULL,
  idea_id INTEGER REFERENCES ideas(id),
  parent_candidate INTEGER REFERENCES candidates(id),
  source TEXT NOT NULL,
  plan_json TEXT NOT NULL,
  content_hash TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'evaluated')),
  raw_response TEXT NOT NULL DEFAULT '',
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE evaluations (
  candidate_id INTEGER PRIMARY KEY REFERENCES candidates(id),
  status TEXT NOT NULL,
  evaluation_json TEXT NOT NULL,
  median_ms REAL,
  speedup_eager REAL,
  speedup_compile REAL,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE llm_calls (
  id INTEGER PRIMARY KEY,
  search_id INTEGER NOT NULL REFERENCES searches(id),
  role TEXT NOT NULL,
  backend TEXT NOT NULL,
  model TEXT NOT NULL,
  prompt TEXT NOT NULL,
  response TEXT NOT NULL,
  tokens_in INTEGER NOT NULL DEFAULT 0,
  tokens_out INTEGER NOT NULL DEFAULT 0,
  latency_s REAL NOT NULL DEFAULT 0,
  cost_usd REAL NOT NULL DEFAULT 0,
  error TEXT NOT NULL DEFAULT '',
  finish_reason TEXT NOT NULL DEFAULT '',
  attempts INTEGER NOT NULL DEFAULT 0,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX candidates_by_search ON candidates(search_id, round);
CREATE INDEX candidates_by_hash ON candidates(content_hash);
CREATE INDEX llm_calls_by_search ON llm_calls(search_id);
)sql",
      // 2: what resume and repair need: slot keys that make every step
      // idempotent, prompt hashes to match finished calls, per-round beams,
      // candidate kinds and repair bookkeeping, reuse links, stop reasons.
      R"sql(
ALTER TABLE searches ADD COLUMN stop_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE ideas ADD COLUMN slot_key TEXT;
ALTER TABLE candidates ADD COLUMN kind TEXT NOT NULL DEFAULT 'primary';
ALTER TABLE candidates ADD COLUMN branch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE candidates ADD COLUMN repair_depth INTEGER NOT NULL DEFAULT 0;
ALTER TABLE candidates ADD COLUMN repair_attempted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE candidates ADD COLUMN slot_key TEXT;
ALTER TABLE evaluations ADD COLUMN reused_from INTEGER;
ALTER TABLE llm_calls ADD COLUMN system TEXT NOT NULL DEFAULT '';
ALTER TABLE llm_calls ADD COLUMN slot_key TEXT NOT NULL DEFAULT '';
ALTER TABLE llm_calls ADD COLUMN prompt_sha256 TEXT NOT NULL DEFAULT '';
CREATE TABLE rounds (
  search_id INTEGER NOT NULL REFERENCES searches(id),
  round INTEGER NOT NULL,
  beam_json TEXT NOT NULL DEFAULT '[]',
  generated INTEGER NOT NULL DEFAULT 0,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  PRIMARY KEY (search_id, round)
);
CREATE UNIQUE INDEX ideas_by_slot ON ideas(search_id, slot_key);
CREATE UNIQUE INDEX candidates_by_slot ON candidates(search_id, slot_key);
CREATE INDEX candidates_pending ON candidates(state) WHERE state = 'pending';
CREATE INDEX llm_calls_by_slot ON llm_calls(search_id, slot_key, prompt_sha256);
)sql",
      // 3: wall time spent on a search so far, summed over every process that
      // ran part of it (resumes, generate-only steps, evaluate-pending), so that
      // a wall-time budget holds across them.
      R"sql(
ALTER TABLE searches ADD COLUMN elapsed_s REAL NOT NULL DEFAULT 0;
)sql",
      // 4: what a GPU node measured about its device, so that the model side of
      // a split search (a machine without the GPU) can tell the model true
      // figures; and which bank kernels (best kernels of other problems) each
      // prompt showed, so that the lineage says where an idea may have come from.
      R"sql(
CREATE TABLE gpu_facts (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  facts_json TEXT NOT NULL,
  search_id INTEGER REFERENCES searches(id),
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX gpu_facts_by_name ON gpu_facts(name, id);
CREATE INDEX gpu_facts_by_search ON gpu_facts(search_id, id);
CREATE TABLE bank_shown (
  search_id INTEGER NOT NULL REFERENCES searches(id),
  slot_key TEXT NOT NULL,
  bank_candidate INTEGER NOT NULL REFERENCES candidates(id),
  PRIMARY KEY (search_id, slot_key, bank_candidate)
);
)sql",
      // 5: suites: many problems searched in one resumable run (kernelsearch
      // suite). An entry names its file; its search once one was created; an
      // error when the problem failed before or during its search.
      R"sql(
CREATE TABLE suites (
  id INTEGER PRIMARY KEY,
  config_json TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  updated TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE TABLE suite_problems (
  suite_id INTEGER NOT NULL REFERENCES suites(id),
  position INTEGER NOT NULL,
  file_path TEXT NOT NULL,
  search_id INTEGER REFERENCES searches(id),
  error TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (suite_id, position)
);
)sql",
      // 6: GPU worker leases (issue 13): the live lease of a pending candidate
      // handed to a remote `kernelsearch gpu-worker`; expired leases are taken
      // over, a reported result removes the row.
      R"sql(
CREATE TABLE leases (
  candidate_id INTEGER PRIMARY KEY REFERENCES candidates(id),
  lease_id TEXT NOT NULL UNIQUE,
  worker TEXT NOT NULL,
  expires_at REAL NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 1,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
)sql",
  };
  return kSteps;
}

constexpr const char* kNow = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

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

constexpr const char* kCandidateColumns =
    "c.id, c.search_id, c.round, c.idea_id, c.parent_candidate, c.source, c.plan_json, c.content_hash, "
    "c.state, c.raw_response, c.kind, c.branch, c.repair_depth, c.repair_attempted, c.slot_key, c.created, "
    "e.candidate_id, e.status, e.evaluation_json, e.median_ms, e.speedup_eager, e.speedup_compile, "
    "e.reused_from, e.created";

StatusOr<CandidateKind> ParseKind(const std::string& s) {
  if (s == "seed") return CandidateKind::kSeed;
  if (s == "primary") return CandidateKind::kPrimary;
  if (s == "repair") return CandidateKind::kRepair;
  return Internal("unknown candidate kind in the store: " + s);
}

StatusOr<CandidateRow> ReadCandidate(const Stmt& s) {
  CandidateRow c;
  c.id = s.Int(0);
  c.search_id = s.Int(1);
  c.round = static_cast<int>(s.Int(2));
  c.idea_id = s.OptInt(3);
  c.parent_candidate = s.OptInt(4);
  c.source = s.Text(5);
  c.plan_json = s.Text(6);
  c.content_hash = s.Text(7);
  c.evaluated = s.Text(8) == "evaluated";
  c.raw_response = s.Text(9);
  KS_ASSIGN_OR_RETURN(c.kind, ParseKind(s.Text(10)));
  c.branch = static_cast<int>(s.Int(11));
  c.repair_depth = static_cast<int>(s.Int(12));
  c.repair_attempted = s.Int(13) != 0;
  c.slot_key = s.Text(14);
  c.created = s.Text(15);
  if (!s.IsNull(16)) {
    EvaluationRow e;
    e.candidate_id = s.Int(16);
    auto st = ParseEvalStatus(s.Text(17));
    if (!st.ok()) return st.status().WithContext("evaluation of candidate " + std::to_string(c.id));
    e.status = *st;
    e.evaluation_json = s.Text(18);
    e.median_ms = s.OptReal(19);
    e.speedup_eager = s.OptReal(20);
    e.speedup_compile = s.OptReal(21);
    e.reused_from = s.OptInt(22);
    e.created = s.Text(23);
    c.evaluation = std::move(e);
  }
  return c;
}

StatusOr<std::vector<CandidateRow>> ReadCandidates(Stmt& s) {
  std::vector<CandidateRow> out;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return out;
    KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(s));
    out.push_back(std::move(c));
  }
}

StatusOr<SearchRow> ReadSearch(const Stmt& s) {
  SearchRow r;
  r.id = s.Int(0);
  r.problem_id = s.Int(1);
  r.config_json = s.Text(2);
  KS_ASSIGN_OR_RETURN(r.status, ParseSearchStatus(s.Text(3)));
  r.stop_reason = s.Text(4);
  r.created = s.Text(5);
  r.updated = s.Text(6);
  r.best_candidate = s.OptInt(7);
  r.elapsed_s = s.Real(8);
  return r;
}
constexpr const char* kSearchColumns =
    "id, problem_id, config_json, status, stop_reason, created, updated, best_candidate, elapsed_s";

IdeaRow ReadIdea(const Stmt& s) {
  IdeaRow i;
  i.id = s.Int(0);
  i.search_id = s.Int(1);
  i.round = static_cast<int>(s.Int(2));
  i.parent_candidate = s.OptInt(3);
  i.text = s.Text(4);
  i.slot_key = s.Text(5);
  i.created = s.Text(6);
  return i;
}
constexpr const char* kIdeaColumns = "id, search_id, round, parent_candidate, text, slot_key, created";

ProblemRow ReadProblem(const Stmt& s) {
  ProblemRow p;
  p.id = s.Int(0);
  p.name = s.Text(1);
  p.file_path = s.Text(2);
  p.source = s.Text(3);
  p.signature_json = s.Text(4);
  p.sha256 = s.Text(5);
  p.created = s.Text(6);
  return p;
}
constexpr const char* kProblemColumns = "id, name, file_path, source, signature_json, sha256, created";

LlmCallRow ReadLlmCall(const Stmt& s) {
  LlmCallRow r;
  r.id = s.Int(0);
  r.search_id = s.Int(1);
  r.slot_key = s.Text(2);
  r.prompt_sha256 = s.Text(3);
  r.record.role = s.Text(4);
  r.record.backend = s.Text(5);
  r.record.model = s.Text(6);
  r.record.system = s.Text(7);
  r.record.prompt = s.Text(8);
  r.record.response = s.Text(9);
  r.record.tokens_in = s.Int(10);
  r.record.tokens_out = s.Int(11);
  r.record.latency_s = s.Real(12);
  r.record.cost_usd = s.Real(13);
  r.record.error = s.Text(14);
  r.record.finish_reason = s.Text(15);
  r.record.attempts = static_cast<int>(s.Int(16));
  r.created = s.Text(17);
  return r;
}
constexpr const char* kLlmCallColumns =
    "id, search_id, slot_key, prompt_sha256, role, backend, model, system, prompt, response, tokens_in, "
    "tokens_out, latency_s, cost_usd, error, finish_reason, attempts, created";

}  // namespace

int LatestSchemaVersion() { return static_cast<int>(Migrations().size()); }

std::string DefaultDbPath() {
  if (const char* p = std::getenv("KS_DB"); p && *p) return p;
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) return std::string(x) + "/kernelsearch/lineage.db";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.local/share/kernelsearch/lineage.db";
}

const char* SearchStatusName(SearchStatus s) {
  switch (s) {
    case SearchStatus::kPending: return "pending";
    case SearchStatus::kRunning: return "running";
    case SearchStatus::kFinished: return "finished";
    case SearchStatus::kCancelled: return "cancelled";
    case SearchStatus::kFailed: return "failed";
  }
  return "?";
}

StatusOr<SearchStatus> ParseSearchStatus(const std::string& s) {
  for (auto st : {SearchStatus::kPending, SearchStatus::kRunning, SearchStatus::kFinished, SearchStatus::kCancelled,
                  SearchStatus::kFailed})
    if (s == SearchStatusName(st)) return st;
  return InvalidArgument("unknown search status: " + s);
}

const char* CandidateKindName(CandidateKind k) {
  switch (k) {
    case CandidateKind::kSeed: return "seed";
    case CandidateKind::kPrimary: return "primary";
    case CandidateKind::kRepair: return "repair";
  }
  return "?";
}

std::string PromptHash(const std::string& role, const std::string& system, const std::string& prompt) {
  std::string key = role;
  key.push_back('\0');
  key += system;
  key.push_back('\0');
  key += prompt;
  return Sha256Hex(key);
}

StatusOr<std::unique_ptr<LineageStore>> LineageStore::Open(const std::string& path, const Options& options) {
  if (path.empty()) return InvalidArgument("lineage store: empty path");
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return FailedPrecondition("creating " + parent.string() + ": " + ec.message());
  }
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  SqliteDbPtr db(raw);  // owns the handle even when open failed
  if (rc != SQLITE_OK) return SqliteError(db.get(), rc, "opening lineage store " + path);
  sqlite3_busy_timeout(db.get(), options.busy_timeout_ms);
  std::unique_ptr<LineageStore> store(new LineageStore(path, std::move(db)));
  // WAL: readers (history, show) never block the running search, and a commit
  // is one append. synchronous=NORMAL in WAL survives a killed process; only a
  // power loss may drop the last commits.
  KS_RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL").WithContext(path));
  KS_RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=NORMAL").WithContext(path));
  KS_RETURN_IF_ERROR(store->Exec("PRAGMA foreign_keys=ON").WithContext(path));
  int max_version = options.max_schema_version > 0 ? options.max_schema_version : LatestSchemaVersion();
  KS_RETURN_IF_ERROR(store->Migrate(max_version).WithContext(path));
  return store;
}

StatusOr<SqliteStmtPtr> LineageStore::Prepare(const std::string& sql) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db_.get(), sql.c_str(), static_cast<int>(sql.size()), &raw, nullptr);
  SqliteStmtPtr stmt(raw);
  if (rc != SQLITE_OK) return SqliteError(db_.get(), rc, "preparing `" + sql.substr(0, 60) + "`");
  return stmt;
}

Status LineageStore::Exec(const std::string& sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_.get(), sql.c_str(), nullptr, nullptr, &err);
  std::unique_ptr<char, decltype(&sqlite3_free)> owned(err, &sqlite3_free);
  if (rc != SQLITE_OK) return SqliteError(db_.get(), rc, "running `" + sql.substr(0, 60) + "`");
  return Status::Ok();
}

#define KS_STMT(var, sql)                     \
  KS_ASSIGN_OR_RETURN(auto var##_ptr, Prepare(sql)); \
  Stmt var(db_.get(), std::move(var##_ptr))

Status LineageStore::Migrate(int max_version) {
  std::lock_guard<std::mutex> lock(mu_);
  // The version check and each step run inside one write transaction, so two
  // processes opening a fresh file at once migrate it exactly once.
  for (;;) {
    Transaction txn(db_.get());
    KS_RETURN_IF_ERROR(txn.Begin());
    int version = 0;
    {
      KS_STMT(q, "PRAGMA user_version");
      KS_ASSIGN_OR_RETURN(bool row, q.Step());
      if (row) version = static_cast<int>(q.Int(0));
    }
    if (version > LatestSchemaVersion())
      return FailedPrecondition("schema version " + std::to_string(version) + " is newer than this build's (" +
                                std::to_string(LatestSchemaVersion()) + "); upgrade kernelsearch");
    if (version >= max_version) return txn.Commit();
    KS_RETURN_IF_ERROR(Exec(Migrations()[version]).WithContext("migrating to schema version " +
                                                                 std::to_string(version + 1)));
    KS_RETURN_IF_ERROR(Exec("PRAGMA user_version = " + std::to_string(version + 1)));
    KS_RETURN_IF_ERROR(txn.Commit());
  }
}

StatusOr<int> LineageStore::SchemaVersion() {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "PRAGMA user_version");
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  return row ? static_cast<int>(q.Int(0)) : 0;
}

// ---- problems ----

StatusOr<int64_t> LineageStore::PutProblem(const ProblemRow& problem) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string sha = problem.sha256.empty() ? Sha256Hex(problem.source) : problem.sha256;
  std::string sig = problem.signature_json.empty() ? "{}" : problem.signature_json;
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  {
    KS_STMT(ins, "INSERT INTO problems (name, file_path, source, signature_json, sha256) VALUES (?, ?, ?, ?, ?) "
                 "ON CONFLICT(sha256) DO UPDATE SET signature_json = excluded.signature_json "
                 "WHERE problems.signature_json = '{}' AND excluded.signature_json != '{}'");
    ins.Bind(1, problem.name).Bind(2, problem.file_path).Bind(3, problem.source).Bind(4, sig).Bind(5, sha);
    KS_RETURN_IF_ERROR(ins.Run());
  }
  KS_STMT(q, "SELECT id FROM problems WHERE sha256 = ?");
  q.Bind(1, sha);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return Internal("problem row vanished after insert");
  int64_t id = q.Int(0);
  KS_RETURN_IF_ERROR(txn.Commit());
  return id;
}

StatusOr<ProblemRow> LineageStore::GetProblem(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kProblemColumns + " FROM problems WHERE id = ?");
  q.Bind(1, id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return NotFound("no problem with id " + std::to_string(id));
  return ReadProblem(q);
}

StatusOr<std::vector<ProblemRow>> LineageStore::FindProblems(const std::string& name_or_path) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kProblemColumns +
                 " FROM problems WHERE name = ?1 OR file_path = ?1 ORDER BY id DESC");
  q.Bind(1, name_or_path);
  std::vector<ProblemRow> out;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return out;
    out.push_back(ReadProblem(q));
  }
}

// ---- searches ----

StatusOr<int64_t> LineageStore::CreateSearch(int64_t problem_id, const std::string& config_json) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(ins, "INSERT INTO searches (problem_id, config_json, status) VALUES (?, ?, 'pending')");
  ins.Bind(1, problem_id).Bind(2, config_json);
  KS_RETURN_IF_ERROR(ins.Run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_.get()));
}

StatusOr<SearchRow> LineageStore::GetSearch(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kSearchColumns + " FROM searches WHERE id = ?");
  q.Bind(1, id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return NotFound("no search with id " + std::to_string(id));
  return ReadSearch(q);
}

Status LineageStore::SetSearchStatus(int64_t id, SearchStatus status, const std::string& stop_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, std::string("UPDATE searches SET status = ?, stop_reason = ?, updated = ") + kNow + " WHERE id = ?");
  u.Bind(1, SearchStatusName(status)).Bind(2, stop_reason).Bind(3, id);
  KS_RETURN_IF_ERROR(u.Run());
  if (sqlite3_changes(db_.get()) == 0) return NotFound("no search with id " + std::to_string(id));
  return Status::Ok();
}

Status LineageStore::AddSearchElapsed(int64_t id, double seconds) {
  if (!(seconds >= 0)) return InvalidArgument("elapsed time must be non-negative");
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, "UPDATE searches SET elapsed_s = elapsed_s + ? WHERE id = ?");
  u.Bind(1, seconds).Bind(2, id);
  KS_RETURN_IF_ERROR(u.Run());
  if (sqlite3_changes(db_.get()) == 0) return NotFound("no search with id " + std::to_string(id));
  return Status::Ok();
}

Status LineageStore::SetBestCandidate(int64_t search_id, std::optional<int64_t> candidate_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, std::string("UPDATE searches SET best_candidate = ?, updated = ") + kNow + " WHERE id = ?");
  u.Bind(1, candidate_id).Bind(2, search_id);
  return u.Run();
}

StatusOr<std::vector<SearchSummary>> LineageStore::History(int64_t problem_id) {
  std::vector<int64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    KS_STMT(q, "SELECT id FROM searches WHERE ?1 = 0 OR problem_id = ?1 ORDER BY id DESC");
    q.Bind(1, problem_id);
    for (;;) {
      KS_ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) break;
      ids.push_back(q.Int(0));
    }
  }
  std::vector<SearchSummary> out;
  for (int64_t id : ids) {
    KS_ASSIGN_OR_RETURN(SearchSummary s, Summarize(id));
    out.push_back(std::move(s));
  }
  return out;
}

StatusOr<SearchSummary> LineageStore::Summarize(int64_t search_id) {
  SearchSummary s;
  KS_ASSIGN_OR_RETURN(s.search, GetSearch(search_id));
  KS_ASSIGN_OR_RETURN(s.spend, Spend(search_id));
  KS_ASSIGN_OR_RETURN(s.failed_calls, FailedLlmCalls(search_id));
  if (s.failed_calls > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    KS_STMT(q, "SELECT error FROM llm_calls WHERE search_id = ? AND error != '' ORDER BY id LIMIT 1");
    q.Bind(1, search_id);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) s.first_llm_error = q.Text(0);
  }
  std::lock_guard<std::mutex> lock(mu_);
  {
    KS_STMT(q, "SELECT name FROM problems WHERE id = ?");
    q.Bind(1, s.search.problem_id);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) s.problem_name = q.Text(0);
  }
  {
    KS_STMT(q, "SELECT COUNT(*), SUM(c.state = 'evaluated'), SUM(e.status = 'correct'), "
               "MAX(CASE WHEN e.status = 'correct' THEN e.speedup_eager END), "
               "MIN(CASE WHEN e.status = 'correct' THEN e.median_ms END) "
               "FROM candidates c LEFT JOIN evaluations e ON e.candidate_id = c.id WHERE c.search_id = ?");
    q.Bind(1, search_id);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) {
      s.candidates = q.Int(0);
      s.evaluated = q.Int(1);
      s.correct = q.Int(2);
      s.best_speedup_eager = q.OptReal(3);
      s.best_median_ms = q.OptReal(4);
    }
  }
  {
    KS_STMT(q, "SELECT COUNT(*) FROM rounds WHERE search_id = ?");
    q.Bind(1, search_id);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (row) s.rounds = static_cast<int>(q.Int(0));
  }
  return s;
}

// ---- rounds ----

namespace {
StatusOr<RoundRow> ReadRound(const Stmt& s) {
  RoundRow r;
  r.search_id = s.Int(0);
  r.round = static_cast<int>(s.Int(1));
  auto beam = nlohmann::json::parse(s.Text(2), nullptr, false);
  if (!beam.is_array()) return Internal("round " + std::to_string(r.round) + ": stored beam is not a JSON array");
  for (const auto& v : beam) r.beam.push_back(v.get<int64_t>());
  r.generated = s.Int(3) != 0;
  return r;
}
}  // namespace

StatusOr<std::optional<RoundRow>> LineageStore::GetRound(int64_t search_id, int round) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT search_id, round, beam_json, generated FROM rounds WHERE search_id = ? AND round = ?");
  q.Bind(1, search_id).Bind(2, round);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<RoundRow>();
  KS_ASSIGN_OR_RETURN(RoundRow r, ReadRound(q));
  return std::optional<RoundRow>(std::move(r));
}

StatusOr<std::optional<RoundRow>> LineageStore::LastRound(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT search_id, round, beam_json, generated FROM rounds WHERE search_id = ? "
             "ORDER BY round DESC LIMIT 1");
  q.Bind(1, search_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<RoundRow>();
  KS_ASSIGN_OR_RETURN(RoundRow r, ReadRound(q));
  return std::optional<RoundRow>(std::move(r));
}

StatusOr<RoundRow> LineageStore::StartRound(int64_t search_id, int round, const std::vector<int64_t>& beam) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    KS_STMT(ins, "INSERT INTO rounds (search_id, round, beam_json) VALUES (?, ?, ?) "
                 "ON CONFLICT(search_id, round) DO NOTHING");
    ins.Bind(1, search_id).Bind(2, round).Bind(3, nlohmann::json(beam).dump());
    KS_RETURN_IF_ERROR(ins.Run());
  }
  KS_ASSIGN_OR_RETURN(auto r, GetRound(search_id, round));
  if (!r) return Internal("round row vanished after insert");
  return *r;
}

Status LineageStore::MarkRoundGenerated(int64_t search_id, int round) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, "UPDATE rounds SET generated = 1 WHERE search_id = ? AND round = ?");
  u.Bind(1, search_id).Bind(2, round);
  return u.Run();
}

// ---- ideas ----

StatusOr<int64_t> LineageStore::PutIdea(const IdeaRow& idea) {
  if (idea.slot_key.empty()) return InvalidArgument("an idea needs a slot key");
  std::lock_guard<std::mutex> lock(mu_);
  Transaction txn(db_.get());
  KS_RETURN_IF_ERROR(txn.Begin());
  {
    KS_STMT(ins, "INSERT INTO ideas (search_id, round, parent_candidate, text, slot_key) VALUES (?, ?, ?, ?, ?) "
                 "ON CONFLICT(search_id, slot_key) DO NOTHING");
    ins.Bind(1, idea.search_id).Bind(2, idea.round).Bind(3, idea.parent_candidate).Bind(4, idea.text)
        .Bind(5, idea.slot_key);
    KS_RETURN_IF_ERROR(ins.Run());
  }
  KS_STMT(q, "SELECT id FROM ideas WHERE search_id = ? AND slot_key = ?");
  q.Bind(1, idea.search_id).Bind(2, idea.slot_key);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return Internal("idea row vanished after insert");
  int64_t id = q.Int(0);
  KS_RETURN_IF_ERROR(txn.Commit());
  return id;
}

StatusOr<IdeaRow> LineageStore::GetIdea(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kIdeaColumns + " FROM ideas WHERE id = ?");
  q.Bind(1, id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return NotFound("no idea with id " + std::to_string(id));
  return ReadIdea(q);
}

StatusOr<std::vector<IdeaRow>> LineageStore::ListIdeas(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kIdeaColumns + " FROM ideas WHERE search_id = ? ORDER BY id");
  q.Bind(1, search_id);
  std::vector<IdeaRow> out;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return out;
    out.push_back(ReadIdea(q));
  }
}

StatusOr<std::optional<IdeaRow>> LineageStore::FindIdeaBySlot(int64_t search_id, const std::string& slot_key) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kIdeaColumns + " FROM ideas WHERE search_id = ? AND slot_key = ?");
  q.Bind(1, search_id).Bind(2, slot_key);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<IdeaRow>();
  return std::optional<IdeaRow>(ReadIdea(q));
}

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
                                                                        const std::string& content_hash) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c JOIN evaluations e ON e.candidate_id = c.id "
                 "JOIN searches s ON s.id = c.search_id "
                 "WHERE c.content_hash = ? AND s.problem_id = ? AND e.reused_from IS NULL ORDER BY c.id LIMIT 1");
  q.Bind(1, content_hash).Bind(2, problem_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<CandidateRow>();
  KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(q));
  return std::optional<CandidateRow>(std::move(c));
}

StatusOr<std::vector<CandidateRow>> LineageStore::CorrectCandidates(int64_t search_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns +
                 " FROM candidates c JOIN evaluations e ON e.candidate_id = c.id "
                 "WHERE c.search_id = ? AND e.status = 'correct' "
                 "ORDER BY e.median_ms IS NULL, e.median_ms, c.id");
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
                 "ORDER BY e.median_ms IS NULL, e.median_ms, c.id LIMIT 1");
  q.Bind(1, problem_id);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::optional<CandidateRow>();
  KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(q));
  return std::optional<CandidateRow>(std::move(c));
}

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

// ---- GPU worker leases (issue 13) ----

Status LineageStore::CopyEvaluationLocked(int64_t to_candidate, int64_t from_candidate) {
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
  KS_STMT(q, std::string("SELECT ") + kCandidateColumns + ", s.problem_id, l.attempts"
                 " FROM candidates c LEFT JOIN evaluations e ON e.candidate_id = c.id"
                 " JOIN searches s ON s.id = c.search_id LEFT JOIN leases l ON l.candidate_id = c.id"
                 " WHERE c.state = 'pending' AND (l.candidate_id IS NULL OR l.expires_at <= ?1)"
                 " AND s.status NOT IN ('cancelled', 'failed')"
                 " AND NOT EXISTS (SELECT 1 FROM candidates c2 JOIN leases l2 ON l2.candidate_id = c2.id"
                 "   JOIN searches s2 ON s2.id = c2.search_id WHERE c2.content_hash = c.content_hash"
                 "   AND s2.problem_id = s.problem_id AND c2.id != c.id AND l2.expires_at > ?1)"
                 " ORDER BY s.problem_id = ?2 DESC, c.id LIMIT 512");
  q.Bind(1, now).Bind(2, prefer_problem);
  struct Found {
    CandidateRow c;
    int64_t problem_id;
    int attempts;
  };
  std::vector<Found> found;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(q));
    found.push_back({std::move(c), q.Int(24), static_cast<int>(q.IsNull(25) ? 0 : q.Int(25))});
  }
  std::vector<LeasedCandidateRow> out;
  std::vector<std::pair<int64_t, std::string>> taken;  // (problem, hash) leased by this call
  for (auto& f : found) {
    if (static_cast<int>(out.size()) >= max) break;
    std::pair<int64_t, std::string> key{f.problem_id, f.c.content_hash};
    if (std::find(taken.begin(), taken.end(), key) != taken.end()) continue;
    {
      // Evaluated before (this search or another of the problem): copy, do not lease.
      KS_STMT(e, "SELECT c.id FROM candidates c JOIN evaluations e ON e.candidate_id = c.id "
                 "JOIN searches s ON s.id = c.search_id WHERE c.content_hash = ? AND s.problem_id = ? "
                 "AND e.reused_from IS NULL ORDER BY c.id LIMIT 1");
      e.Bind(1, f.c.content_hash).Bind(2, f.problem_id);
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
  std::string hash;
  {
    KS_STMT(q, "SELECT s.problem_id, c.search_id, c.content_hash FROM leases l JOIN candidates c ON c.id = "
               "l.candidate_id JOIN searches s ON s.id = c.search_id WHERE l.candidate_id = ? AND l.lease_id = ? "
               "AND l.expires_at > ? AND c.state = 'pending'");
    q.Bind(1, candidate_id).Bind(2, lease_id).Bind(3, now);
    KS_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row)
      return FailedPrecondition("the lease of candidate " + std::to_string(candidate_id) +
                                " is not held (expired, released or already reported); its result is dropped");
    problem_id = q.Int(0);
    search_id = q.Int(1);
    hash = q.Text(2);
  }
  KS_RETURN_IF_ERROR(PutEvaluationLocked(candidate_id, evaluation, std::nullopt));  // ends the lease
  std::vector<int64_t> searches = {search_id};
  std::vector<std::pair<int64_t, int64_t>> twins;  // (candidate, search)
  {
    KS_STMT(q, "SELECT c.id, c.search_id FROM candidates c JOIN searches s ON s.id = c.search_id "
               "LEFT JOIN leases l ON l.candidate_id = c.id WHERE c.state = 'pending' AND c.content_hash = ? "
               "AND s.problem_id = ? AND (l.candidate_id IS NULL OR l.expires_at <= ?) ORDER BY c.id");
    q.Bind(1, hash).Bind(2, problem_id).Bind(3, now);
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

StatusOr<std::pair<int64_t, int64_t>> LineageStore::PendingAndLeased(int64_t search_id, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(q, "SELECT COUNT(*), COUNT(l.candidate_id) FROM candidates c LEFT JOIN leases l ON "
             "l.candidate_id = c.id AND l.expires_at > ?2 WHERE c.state = 'pending' AND (?1 = 0 OR c.search_id = ?1)");
  q.Bind(1, search_id).Bind(2, now);
  KS_ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return std::pair<int64_t, int64_t>{0, 0};
  return std::pair<int64_t, int64_t>{q.Int(0), q.Int(1)};
}

#undef KS_STMT

}  // namespace ks::store
