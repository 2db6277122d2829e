// RAII for the SQLite C handles the lineage store uses, and the one place where an
// sqlite result code becomes a Status (with the caller's context and
// sqlite3_errmsg). Internal to store/.
#pragma once

#include <sqlite3.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace ks::store {

struct SqliteDbDeleter {
  // sqlite3_close_v2 defers the close until every statement is finalized, so the
  // order in which owners die cannot leak or crash.
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
struct SqliteStmtDeleter {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using SqliteDbPtr = std::unique_ptr<sqlite3, SqliteDbDeleter>;
using SqliteStmtPtr = std::unique_ptr<sqlite3_stmt, SqliteStmtDeleter>;

// "context: <sqlite message> (<rc name>)"; busy and locked map to Unavailable
// (another process holds the file), the rest to Internal.
inline Status SqliteError(sqlite3* db, int rc, const std::string& context) {
  std::string msg = context + ": ";
  msg += db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  msg += std::string(" (") + sqlite3_errstr(rc) + ")";
  int primary = rc & 0xff;
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) return Unavailable(msg);
  if (primary == SQLITE_CANTOPEN || primary == SQLITE_PERM || primary == SQLITE_READONLY)
    return FailedPrecondition(msg);
  if (primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT) return FailedPrecondition(msg);
  return Internal(msg);
}

}  // namespace ks::store
