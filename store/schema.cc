// The lineage store's schema: its migrations, and migrating a file on open.
#include <mutex>
#include <string>
#include <vector>

#include "store/lineage_store.h"
#include "store/store_sql.h"

namespace ks::store {
namespace internal {

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
      // 7: agent attempts (issue 24): each tool call of an agent's
      // conversation (search/agent.h), its candidate and what the model was
      // told, stored before the next model turn so a resumed search replays
      // the conversation instead of paying for it again. One row per
      // (implementation slot, turn, call); `candidate_id` is the submitted one.
      R"sql(
CREATE TABLE attempts (
  id INTEGER PRIMARY KEY,
  search_id INTEGER NOT NULL REFERENCES searches(id),
  idea_id INTEGER REFERENCES ideas(id),
  slot_key TEXT NOT NULL,
  turn INTEGER NOT NULL,
  call_index INTEGER NOT NULL,
  tool_call_id TEXT NOT NULL,
  tool TEXT NOT NULL,
  arguments TEXT NOT NULL,
  source TEXT NOT NULL DEFAULT '',
  plan_json TEXT NOT NULL DEFAULT '',
  status TEXT NOT NULL DEFAULT '',
  is_error INTEGER NOT NULL DEFAULT 0,
  result TEXT NOT NULL,
  evaluation_json TEXT NOT NULL DEFAULT '',
  candidate_id INTEGER REFERENCES candidates(id),
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  UNIQUE (search_id, slot_key, turn, call_index)
);
CREATE INDEX attempts_by_idea ON attempts (search_id, idea_id);
)sql",
      // 8: an agent's practice calls through GPU workers (issue 32): each
      // compile/test/profile call of an agent that the server runs is leased
      // to a `kernelsearch gpu-worker` like a candidate, on a short lease
      // (`lease_s`, renewed by the worker), so that a worker killed mid-call
      // loses nothing: its lease expires and another worker takes the call.
      // state: pending (waiting or leased), done (result_json), failed
      // (error), abandoned (the server's agent stopped waiting).
      R"sql(
CREATE TABLE practice_calls (
  id INTEGER PRIMARY KEY,
  search_id INTEGER NOT NULL REFERENCES searches(id),
  tool TEXT NOT NULL CHECK (tool IN ('compile', 'test', 'profile')),
  source TEXT NOT NULL,
  plan_json TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'failed', 'abandoned')),
  result_json TEXT NOT NULL DEFAULT '',
  error TEXT NOT NULL DEFAULT '',
  lease_id TEXT UNIQUE,
  worker TEXT NOT NULL DEFAULT '',
  lease_s REAL NOT NULL DEFAULT 0,
  expires_at REAL NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX practice_calls_pending ON practice_calls(state) WHERE state = 'pending';
CREATE INDEX practice_calls_by_search ON practice_calls(search_id, tool);
)sql",
  };
  return kSteps;
}

}  // namespace internal

using internal::Migrations;
using internal::Transaction;

int LatestSchemaVersion() { return static_cast<int>(Migrations().size()); }

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

}  // namespace ks::store
