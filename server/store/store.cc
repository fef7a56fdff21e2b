// The store's database (store.h): opening it (pragmas, the quick check, the read pool), the schema
// and its migrations, transactions, query plans, the integrity check, and how a SQLite error reads
// (a full disk named with its filesystem, a corrupt file, a busy lock). What is stored and read is
// in store_jobs.cc (a job's record and events), store_queries.cc (listing and counting jobs) and
// store_usage.cc (GPU time of ended attempts).
#include "server/store/store.h"

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/common/filesystem_info.h"
#include "server/common/sqlite_stmt.h"

namespace ftd::server {

bool IsTerminal(ftd::v1::JobState s) {
  return s == ftd::v1::SUCCEEDED || s == ftd::v1::FAILED || s == ftd::v1::CANCELLED;
}

namespace {

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status Store::Error(sqlite3* db, const char* what) const {
  const int code = sqlite3_extended_errcode(db);
  const int primary = code & 0xff;
  const int sys = sqlite3_system_errno(db);
  std::string msg = absl::StrCat("database ", path_, ": ", what, ": ", sqlite3_errmsg(db));
  if (primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT) {
    return absl::DataLossError(absl::StrCat(msg, " (the file is corrupt or not an ftd database: restore it from a "
                                                 "backup or move it away to start empty)"));
  }
  if (primary == SQLITE_FULL || (primary == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT))) {
    const std::string dir = DirOf(path_);
    std::string detail = DescribeFilesystem(dir);
    if (sys == EDQUOT) absl::StrAppend(&detail, detail.empty() ? "" : ", ", "disk quota exceeded");
    return absl::ResourceExhaustedError(absl::StrCat(
        "the disk is full: no space left for ftd's data directory ", dir, detail.empty() ? "" : " (" + detail + ")",
        "; nothing of this write was kept (", what, ": ", sqlite3_errmsg(db),
        "). Free space on that disk, or move the data directory to a larger one, then retry"));
  }
  if (primary == SQLITE_BUSY) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

absl::Status Store::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    sqlite3_free(err);
    return Error(sql);
  }
  return absl::OkStatus();
}

absl::Status Store::Begin() { return Exec("BEGIN IMMEDIATE"); }
absl::Status Store::Commit() { return Exec("COMMIT"); }
void Store::Rollback() { sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr); }

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  std::unique_ptr<Store> s(new Store());
  s->path_ = path;
  if (sqlite3_open_v2(path.c_str(), &s->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    return s->Error("open");
  }
  sqlite3_busy_timeout(s->db_, 5000);
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    if (auto st = s->Exec(pragma); !st.ok()) return st;
  }
  {
    Stmt q(s->db_, "PRAGMA quick_check");
    if (!q.ok() || q.Step() != SQLITE_ROW) return s->Error("quick_check");
    if (q.Text(0) != "ok") {
      return absl::DataLossError(absl::StrCat("database ", path, " failed its integrity check (", q.Text(0),
                                              "): restore it from a backup or move it away to start empty"));
    }
  }
  // Foreign keys are checked from here on; a migration that rebuilds a table runs without them
  // (SQLite's procedure for changing a table's constraints) and checks them before it commits.
  if (auto st = s->Migrate(); !st.ok()) return st;
  if (auto st = s->Exec("PRAGMA foreign_keys=ON"); !st.ok()) return st;
  for (int i = 0; i < kReadConnections; ++i) {
    sqlite3* r = nullptr;
    const int rc = sqlite3_open_v2(path.c_str(), &r, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr);
    if (r != nullptr) s->readers_.push_back(r);
    if (rc != SQLITE_OK) return s->Error(r, "open a read connection");
    sqlite3_busy_timeout(r, 5000);
    if (sqlite3_exec(r, "PRAGMA query_only=ON", nullptr, nullptr, nullptr) != SQLITE_OK) {
      return s->Error(r, "open a read connection");
    }
  }
  s->idle_ = s->readers_;
  return s;
}

Store::~Store() {
  for (sqlite3* r : readers_) sqlite3_close(r);
  if (db_ != nullptr) sqlite3_close(db_);
}

Store::ReadTxn::ReadTxn(Store* s) : s_(s) {
  std::unique_lock<std::mutex> l(s->pool_mu_);
  s->pool_cv_.wait(l, [&] { return !s->idle_.empty(); });
  db_ = s->idle_.back();
  s->idle_.pop_back();
  l.unlock();
  sqlite3_exec(db_, "BEGIN", nullptr, nullptr, nullptr);  // the snapshot starts at the first read
}

Store::ReadTxn::~ReadTxn() {
  sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  {
    std::lock_guard<std::mutex> l(s_->pool_mu_);
    s_->idle_.push_back(db_);
  }
  s_->pool_cv_.notify_one();
}

absl::Status Store::Migrate() {
  if (auto st = Begin(); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    Rollback();
    return st;
  };
  if (auto st = Exec("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)"); !st.ok()) {
    return fail(st);
  }
  int64_t version = 0;
  {
    Stmt q(db_, "SELECT value FROM meta WHERE key = 'schema_version'");
    if (q.Step() == SQLITE_ROW) version = std::stoll(q.Text(0));
  }
  if (version > kSchemaVersion) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "database ", path_, " has schema version ", version, ", newer than this ftd understands (", kSchemaVersion,
        "): run the ftd that wrote it, or a newer one")));
  }
  // Each version's steps, applied in order to what the file has; all of them in this transaction.
  static const std::vector<std::vector<const char*>> kSteps = {
      // 1: jobs (the record is the protobuf `job`; the columns beside it are what queries filter
      // on) and their events.
      {"CREATE TABLE jobs(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, request_id TEXT UNIQUE,"
       " state INTEGER NOT NULL, owner TEXT NOT NULL, kind INTEGER NOT NULL, priority INTEGER NOT NULL,"
       " next_event INTEGER NOT NULL DEFAULT 1, job BLOB NOT NULL)",
       "CREATE INDEX jobs_by_state ON jobs(state, priority DESC, seq)",
       "CREATE TABLE events(job_seq INTEGER NOT NULL REFERENCES jobs(seq), seq INTEGER NOT NULL,"
       " unix_ms INTEGER NOT NULL, event BLOB NOT NULL, PRIMARY KEY(job_seq, seq)) WITHOUT ROWID"},
      // 2: listing. Every filter is equalities on (owner, kind, state) followed by the order on seq,
      // so each combination has an index ending in seq; a filter without a state is run once per
      // state and the pages merged (List).
      {"CREATE INDEX jobs_list_state ON jobs(state, seq)",
       "CREATE INDEX jobs_list_owner ON jobs(owner, state, seq)",
       "CREATE INDEX jobs_list_kind ON jobs(kind, state, seq)",
       "CREATE INDEX jobs_list_owner_kind ON jobs(owner, kind, state, seq)"},
      // 3: GPU time of ended attempts, read from a time on at start (quotas and fair share).
      {"CREATE TABLE usage(seq INTEGER PRIMARY KEY, owner TEXT NOT NULL, job_id TEXT NOT NULL,"
       " attempt INTEGER NOT NULL, gpus REAL NOT NULL, start_ms INTEGER NOT NULL, end_ms INTEGER NOT NULL)",
       "CREATE INDEX usage_by_end ON usage(end_ms)"},
      // 4: request ids are per owner: the same id from two owners names two jobs (it was unique
      // across all users, so one user's id named, and blocked, another's job). The table is rebuilt
      // with UNIQUE(owner, request_id) in place of the column's UNIQUE; its AUTOINCREMENT counter is
      // carried over, so that the id of a deleted job is never given again.
      {"CREATE TABLE jobs_v4(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, request_id TEXT,"
       " state INTEGER NOT NULL, owner TEXT NOT NULL, kind INTEGER NOT NULL, priority INTEGER NOT NULL,"
       " next_event INTEGER NOT NULL DEFAULT 1, job BLOB NOT NULL, UNIQUE(owner, request_id))",
       "INSERT INTO jobs_v4(seq, id, request_id, state, owner, kind, priority, next_event, job)"
       " SELECT seq, id, request_id, state, owner, kind, priority, next_event, job FROM jobs",
       "DELETE FROM sqlite_sequence WHERE name = 'jobs_v4'",
       "INSERT INTO sqlite_sequence(name, seq) SELECT 'jobs_v4', seq FROM sqlite_sequence WHERE name = 'jobs'",
       "DROP TABLE jobs",
       "ALTER TABLE jobs_v4 RENAME TO jobs",
       "CREATE INDEX jobs_by_state ON jobs(state, priority DESC, seq)",
       "CREATE INDEX jobs_list_state ON jobs(state, seq)",
       "CREATE INDEX jobs_list_owner ON jobs(owner, state, seq)",
       "CREATE INDEX jobs_list_kind ON jobs(kind, state, seq)",
       "CREATE INDEX jobs_list_owner_kind ON jobs(owner, kind, state, seq)"},
  };
  static_assert(kSchemaVersion == 4, "add the new version's steps above");
  for (int64_t v = version + 1; v <= kSchemaVersion; ++v) {
    for (const char* sql : kSteps[v - 1]) {
      if (auto st = Exec(sql); !st.ok()) return fail(st);
    }
  }
  if (version != kSchemaVersion) {
    {
      Stmt fk(db_, "PRAGMA foreign_key_check");
      if (const int rc = fk.Step(); rc == SQLITE_ROW) {
        return fail(absl::DataLossError(absl::StrCat("database ", path_, ": the upgrade to schema version ",
                                                     kSchemaVersion, " found rows of table ", fk.Text(0),
                                                     " that refer to no job; restore the file from a backup")));
      } else if (rc != SQLITE_DONE) {
        return fail(Error("check foreign keys"));
      }
    }
    Stmt u(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', ?)");
    u.Bind(1, absl::StrCat(kSchemaVersion));
    if (u.Step() != SQLITE_DONE) return fail(Error("set schema version"));
  }
  return Commit();
}

absl::StatusOr<std::vector<std::string>> Store::PlanLocked(sqlite3* db, const std::string& sql) {
  Stmt q(db, ("EXPLAIN QUERY PLAN " + sql).c_str());
  if (!q.ok()) return Error(db, "explain");
  std::vector<std::string> lines;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) lines.push_back(q.Text(3));
  if (rc != SQLITE_DONE) return Error(db, "explain");
  return lines;
}

absl::Status Store::IntegrityCheck() {
  ReadTxn r(this);
  Stmt q(r.db(), "PRAGMA integrity_check");
  if (q.Step() != SQLITE_ROW) return Error(r.db(), "integrity_check");
  if (q.Text(0) != "ok") return absl::DataLossError(q.Text(0));
  return absl::OkStatus();
}

}  // namespace ftd::server
