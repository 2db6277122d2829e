#include "store/lineage_store.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "store/candidate_hash.h"
#include "store/store_sql.h"

// Opening a store, the names of its enums, problems, searches, rounds and ideas.
// The other concerns have their own files (store_sql.h lists them).
namespace ks::store {

using namespace internal;  // NOLINT: Stmt, Transaction, the readers and column lists

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
  if (options.must_exist && !std::filesystem::exists(path))
    return NotFound("no lineage store at " + path + " (a search creates it; pick one with --db or $KS_DB)");
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

Status LineageStore::SetSearchConfig(int64_t id, const std::string& config_json) {
  std::lock_guard<std::mutex> lock(mu_);
  KS_STMT(u, std::string("UPDATE searches SET config_json = ?, updated = ") + kNow + " WHERE id = ?");
  u.Bind(1, config_json).Bind(2, id);
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

}  // namespace ks::store
