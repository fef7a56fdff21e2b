#include "server/store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ftd::server {
namespace {

// RAII statement with checked steps.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindNull(int i) {
    sqlite3_bind_null(s_, i);
    return *this;
  }
  int Step() { return rc_ = sqlite3_step(s_); }
  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(s_, col);
    return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), sqlite3_column_bytes(s_, col));
  }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(s_, col);
    return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

}  // namespace

bool IsTerminal(ftd::v1::JobState s) {
  return s == ftd::v1::SUCCEEDED || s == ftd::v1::FAILED || s == ftd::v1::CANCELLED;
}

absl::Status Store::Error(const char* what) const {
  const int code = sqlite3_errcode(db_);
  std::string msg = absl::StrCat("database ", path_, ": ", what, ": ", sqlite3_errmsg(db_));
  if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) {
    return absl::DataLossError(absl::StrCat(msg, " (the file is corrupt or not an ftd database: restore it from a "
                                                 "backup or move it away to start empty)"));
  }
  if (code == SQLITE_BUSY) return absl::UnavailableError(msg);
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
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON"}) {
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
  if (auto st = s->Migrate(); !st.ok()) return st;
  return s;
}

Store::~Store() {
  if (db_ != nullptr) sqlite3_close(db_);
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
  if (version == 0) {
    const char* ddl[] = {
        "CREATE TABLE jobs(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, request_id TEXT UNIQUE,"
        " state INTEGER NOT NULL, owner TEXT NOT NULL, kind INTEGER NOT NULL, priority INTEGER NOT NULL,"
        " next_event INTEGER NOT NULL DEFAULT 1, job BLOB NOT NULL)",
        "CREATE INDEX jobs_by_state ON jobs(state, priority DESC, seq)",
        "CREATE TABLE events(job_seq INTEGER NOT NULL REFERENCES jobs(seq), seq INTEGER NOT NULL,"
        " unix_ms INTEGER NOT NULL, event BLOB NOT NULL, PRIMARY KEY(job_seq, seq)) WITHOUT ROWID",
        "INSERT INTO meta(key, value) VALUES('schema_version', '1')"};
    for (const char* sql : ddl) {
      if (auto st = Exec(sql); !st.ok()) return fail(st);
    }
  }
  return Commit();
}

absl::StatusOr<std::optional<ftd::v1::Job>> Store::LoadLocked(const std::string& id, int64_t* seq) {
  Stmt q(db_, "SELECT seq, job FROM jobs WHERE id = ?");
  q.Bind(1, id);
  const int rc = q.Step();
  if (rc == SQLITE_DONE) return std::optional<ftd::v1::Job>();
  if (rc != SQLITE_ROW) return Error("load job");
  ftd::v1::Job job;
  if (!job.ParseFromString(q.Blob(1))) return absl::DataLossError(absl::StrCat("job ", id, " record is corrupt"));
  if (seq != nullptr) *seq = q.Int(0);
  return std::optional<ftd::v1::Job>(std::move(job));
}

absl::Status Store::SaveLocked(int64_t seq, const ftd::v1::Job& job) {
  Stmt u(db_, "UPDATE jobs SET state = ?, owner = ?, kind = ?, priority = ?, job = ? WHERE seq = ?");
  u.Bind(1, job.state()).Bind(2, job.owner()).Bind(3, job.kind()).Bind(4, job.priority());
  u.BindBlob(5, job.SerializeAsString()).Bind(6, seq);
  if (u.Step() != SQLITE_DONE) return Error("save job");
  return absl::OkStatus();
}

absl::Status Store::AppendLocked(int64_t job_seq, ftd::v1::JobEvent& e, int64_t now_ms) {
  Stmt n(db_, "UPDATE jobs SET next_event = next_event + 1 WHERE seq = ? RETURNING next_event - 1");
  n.Bind(1, job_seq);
  if (n.Step() != SQLITE_ROW) return Error("number event");
  e.set_seq(n.Int(0));
  e.set_unix_ms(now_ms);
  Stmt i(db_, "INSERT INTO events(job_seq, seq, unix_ms, event) VALUES(?, ?, ?, ?)");
  i.Bind(1, job_seq).Bind(2, e.seq()).Bind(3, now_ms).BindBlob(4, e.SerializeAsString());
  if (i.Step() != SQLITE_DONE) return Error("append event");
  return absl::OkStatus();
}

absl::StatusOr<std::pair<ftd::v1::Job, bool>> Store::Insert(ftd::v1::Job job, int64_t now_ms) {
  std::lock_guard<std::mutex> l(mu_);
  if (auto st = Begin(); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    Rollback();
    return st;
  };
  if (!job.request_id().empty()) {
    Stmt q(db_, "SELECT id FROM jobs WHERE request_id = ?");
    q.Bind(1, job.request_id());
    if (q.Step() == SQLITE_ROW) {
      auto existing = LoadLocked(q.Text(0), nullptr);
      Rollback();
      if (!existing.ok()) return existing.status();
      return std::make_pair(**existing, false);
    }
  }
  {
    Stmt i(db_, "INSERT INTO jobs(id, request_id, state, owner, kind, priority, job) VALUES(?, ?, ?, ?, ?, ?, x'')");
    i.Bind(1, absl::StrCat("pending-", now_ms, "-", reinterpret_cast<uintptr_t>(&job)));
    if (job.request_id().empty()) {
      i.BindNull(2);
    } else {
      i.Bind(2, job.request_id());
    }
    i.Bind(3, job.state()).Bind(4, job.owner()).Bind(5, job.kind()).Bind(6, job.priority());
    if (i.Step() != SQLITE_DONE) return fail(Error("insert job"));
  }
  const int64_t seq = sqlite3_last_insert_rowid(db_);
  job.set_id(absl::StrFormat("j-%06d", seq));
  job.set_created_unix_ms(now_ms);
  {
    Stmt u(db_, "UPDATE jobs SET id = ? WHERE seq = ?");
    u.Bind(1, job.id()).Bind(2, seq);
    if (u.Step() != SQLITE_DONE) return fail(Error("name job"));
  }
  if (auto st = SaveLocked(seq, job); !st.ok()) return fail(st);
  ftd::v1::JobEvent e;
  *e.mutable_state() = job;
  if (auto st = AppendLocked(seq, e, now_ms); !st.ok()) return fail(st);
  if (auto st = Commit(); !st.ok()) return fail(st);
  return std::make_pair(job, true);
}

absl::StatusOr<ftd::v1::Job> Store::Get(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  auto j = LoadLocked(id, nullptr);
  if (!j.ok()) return j.status();
  if (!j->has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " does not exist (ftctl list shows the jobs)"));
  return **j;
}

absl::StatusOr<std::vector<ftd::v1::Job>> Store::List(const JobFilter& f, int64_t* next_seq) {
  std::lock_guard<std::mutex> l(mu_);
  std::string sql = "SELECT seq, job, state FROM jobs WHERE seq > ?";
  if (!f.owner.empty()) sql += " AND owner = ?";
  if (f.kind != ftd::v1::JOB_KIND_UNSPECIFIED) sql += " AND kind = ?";
  sql += " ORDER BY seq";
  Stmt q(db_, sql.c_str());
  int b = 1;
  q.Bind(b++, f.after_seq);
  if (!f.owner.empty()) q.Bind(b++, f.owner);
  if (f.kind != ftd::v1::JOB_KIND_UNSPECIFIED) q.Bind(b++, f.kind);
  std::vector<ftd::v1::Job> out;
  *next_seq = 0;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    const auto state = static_cast<ftd::v1::JobState>(q.Int(2));
    if (!f.states.empty() && std::find(f.states.begin(), f.states.end(), state) == f.states.end()) continue;
    if (static_cast<int>(out.size()) == f.limit) {
      *next_seq = out.empty() ? 0 : q.Int(0) - 1;
      break;
    }
    ftd::v1::Job job;
    if (!job.ParseFromString(q.Blob(1))) return absl::DataLossError("a job record is corrupt");
    out.push_back(std::move(job));
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("list jobs");
  return out;
}

absl::StatusOr<ftd::v1::Job> Store::Update(
    const std::string& id,
    const std::function<absl::Status(ftd::v1::Job&, std::vector<ftd::v1::JobEvent>&)>& mutate, int64_t now_ms) {
  std::lock_guard<std::mutex> l(mu_);
  if (auto st = Begin(); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    Rollback();
    return st;
  };
  int64_t seq = 0;
  auto j = LoadLocked(id, &seq);
  if (!j.ok()) return fail(j.status());
  if (!j->has_value()) return fail(absl::NotFoundError(absl::StrCat("job ", id, " does not exist")));
  ftd::v1::Job job = **j;
  std::vector<ftd::v1::JobEvent> events;
  if (auto st = mutate(job, events); !st.ok()) return fail(st);
  if (auto st = SaveLocked(seq, job); !st.ok()) return fail(st);
  for (auto& e : events) {
    if (auto st = AppendLocked(seq, e, now_ms); !st.ok()) return fail(st);
  }
  if (auto st = Commit(); !st.ok()) return fail(st);
  return job;
}

absl::Status Store::AppendEvent(const std::string& id, ftd::v1::JobEvent event, int64_t now_ms) {
  return Update(
             id,
             [&](ftd::v1::Job& job, std::vector<ftd::v1::JobEvent>& events) {
               if (event.has_step()) *job.mutable_last_step() = event.step();
               if (event.has_profile()) *job.mutable_profile() = event.profile();
               events.push_back(event);
               return absl::OkStatus();
             },
             now_ms)
      .status();
}

absl::StatusOr<std::vector<ftd::v1::JobEvent>> Store::Events(const std::string& id, int64_t after_seq, int limit) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt q(db_,
         "SELECT e.event FROM events e JOIN jobs j ON e.job_seq = j.seq WHERE j.id = ? AND e.seq > ? "
         "ORDER BY e.seq LIMIT ?");
  q.Bind(1, id).Bind(2, after_seq).Bind(3, limit);
  std::vector<ftd::v1::JobEvent> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    ftd::v1::JobEvent e;
    if (!e.ParseFromString(q.Blob(0))) return absl::DataLossError(absl::StrCat("an event of job ", id, " is corrupt"));
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return Error("read events");
  return out;
}

absl::StatusOr<std::vector<ftd::v1::Job>> Store::JobsInStates(const std::vector<ftd::v1::JobState>& states) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<ftd::v1::Job> out;
  for (auto s : states) {
    Stmt q(db_, "SELECT job FROM jobs WHERE state = ? ORDER BY priority DESC, seq");
    q.Bind(1, s);
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      ftd::v1::Job job;
      if (!job.ParseFromString(q.Blob(0))) return absl::DataLossError("a job record is corrupt");
      out.push_back(std::move(job));
    }
    if (rc != SQLITE_DONE) return Error("jobs by state");
  }
  return out;
}

absl::StatusOr<int64_t> Store::CountInState(ftd::v1::JobState state) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt q(db_, "SELECT COUNT(*) FROM jobs WHERE state = ?");
  q.Bind(1, state);
  if (q.Step() != SQLITE_ROW) return Error("count jobs");
  return q.Int(0);
}

absl::Status Store::IntegrityCheck() {
  std::lock_guard<std::mutex> l(mu_);
  Stmt q(db_, "PRAGMA integrity_check");
  if (q.Step() != SQLITE_ROW) return Error("integrity_check");
  if (q.Text(0) != "ok") return absl::DataLossError(q.Text(0));
  return absl::OkStatus();
}

}  // namespace ftd::server
