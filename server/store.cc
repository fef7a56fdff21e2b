#include "server/store.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/sqlite_stmt.h"

namespace ftd::server {

bool IsTerminal(ftd::v1::JobState s) {
  return s == ftd::v1::SUCCEEDED || s == ftd::v1::FAILED || s == ftd::v1::CANCELLED;
}

namespace {

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", b) : absl::StrFormat("%.1f %s", b, units[u]);
}

// mountinfo escapes blanks, tabs, newlines and backslashes in paths as octal (\040).
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])) != 0) {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 3).c_str(), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// "filesystem tmpfs (tmpfs) mounted on /srv/ftd, 0 B of 2.0 MiB free": the filesystem that holds
// `dir`, from /proc/self/mountinfo (the mount with dir's device and the longest matching mount point)
// and statvfs. Empty where neither can be read.
std::string DescribeFilesystem(const std::string& dir) {
  std::string where;
  struct stat st {};
  char* real = ::realpath(dir.c_str(), nullptr);
  const std::string path = real != nullptr ? real : dir;
  std::free(real);
  if (::stat(path.c_str(), &st) == 0) {
    std::ifstream in("/proc/self/mountinfo");
    std::string line, best_point, best_source, best_type;
    const std::string dev = absl::StrCat(major(st.st_dev), ":", minor(st.st_dev));
    while (std::getline(in, line)) {
      // id parent major:minor root mount-point options [optional...] - fstype source super-options
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      auto dash = std::find(f.begin(), f.end(), "-");
      if (f.size() < 5 || dash == f.end() || dash + 2 >= f.end() || f[2] != dev) continue;
      const std::string point = Unescape(f[4]);
      const bool under = point == "/" || path == point || path.rfind(point + "/", 0) == 0;
      if (under && point.size() >= best_point.size()) {
        best_point = point;
        best_type = *(dash + 1);
        best_source = Unescape(*(dash + 2));
      }
    }
    if (!best_point.empty()) where = absl::StrCat("filesystem ", best_source, " (", best_type, ") mounted on ", best_point);
  }
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) == 0) {
    absl::StrAppend(&where, where.empty() ? "" : ", ",
                    Bytes(static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize)), " of ",
                    Bytes(static_cast<double>(vfs.f_blocks) * static_cast<double>(vfs.f_frsize)), " free");
  }
  return where;
}

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
  };
  static_assert(kSchemaVersion == 3, "add the new version's steps above");
  for (int64_t v = version + 1; v <= kSchemaVersion; ++v) {
    for (const char* sql : kSteps[v - 1]) {
      if (auto st = Exec(sql); !st.ok()) return fail(st);
    }
  }
  if (version != kSchemaVersion) {
    Stmt u(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', ?)");
    u.Bind(1, absl::StrCat(kSchemaVersion));
    if (u.Step() != SQLITE_DONE) return fail(Error("set schema version"));
  }
  return Commit();
}

absl::StatusOr<std::optional<ftd::v1::Job>> Store::LoadLocked(sqlite3* db, const std::string& id, int64_t* seq) {
  Stmt q(db, "SELECT seq, job FROM jobs WHERE id = ?");
  q.Bind(1, id);
  const int rc = q.Step();
  if (rc == SQLITE_DONE) return std::optional<ftd::v1::Job>();
  if (rc != SQLITE_ROW) return Error(db, "load job");
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

absl::StatusOr<std::pair<ftd::v1::Job, bool>> Store::Insert(ftd::v1::Job job, int64_t now_ms, int64_t max_queued,
                                                             int64_t max_queued_owner) {
  std::lock_guard<std::mutex> l(mu_);
  if (auto st = Begin(); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    Rollback();
    return st;
  };
  // The request id first: a retried submit learns of its job even when the queue has filled since.
  if (!job.request_id().empty()) {
    Stmt q(db_, "SELECT id FROM jobs WHERE request_id = ?");
    q.Bind(1, job.request_id());
    const int rc = q.Step();
    if (rc == SQLITE_ROW) {
      auto existing = LoadLocked(db_, q.Text(0), nullptr);
      Rollback();
      if (!existing.ok()) return existing.status();
      return std::make_pair(**existing, false);
    }
    if (rc != SQLITE_DONE) return fail(Error("look up request_id"));
  }
  // The limit inside the transaction that inserts: BEGIN IMMEDIATE holds the write lock from the
  // count to the commit, so concurrent submits cannot all see room for one more. Counting stops at
  // the limit.
  if (job.state() == ftd::v1::QUEUED) {
    Stmt c(db_, "SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE state = ? LIMIT ?)");
    c.Bind(1, ftd::v1::QUEUED).Bind(2, std::max<int64_t>(max_queued, 0));
    if (c.Step() != SQLITE_ROW) return fail(Error("count queued jobs"));
    if (c.Int(0) >= max_queued) {
      return fail(absl::ResourceExhaustedError(absl::StrCat("the queue is full (", c.Int(0), " jobs queued, limit ",
                                                            max_queued, "); retry later or cancel queued jobs")));
    }
  }
  if (job.state() == ftd::v1::QUEUED && max_queued_owner > 0) {
    Stmt c(db_, "SELECT COUNT(*) FROM (SELECT 1 FROM jobs WHERE owner = ? AND state = ? LIMIT ?)");
    c.Bind(1, job.owner()).Bind(2, ftd::v1::QUEUED).Bind(3, max_queued_owner);
    if (c.Step() != SQLITE_ROW) return fail(Error("count the owner's queued jobs"));
    if (c.Int(0) >= max_queued_owner) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "user ", job.owner(), " has ", c.Int(0), " job(s) queued, the limit for the user (queued=", max_queued_owner,
          "); submit again once some have started, or cancel queued ones")));
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

absl::Status Store::AddUsage(const UsageRecord& r) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt i(db_, "INSERT INTO usage(owner, job_id, attempt, gpus, start_ms, end_ms) VALUES(?, ?, ?, ?, ?, ?)");
  i.Bind(1, r.owner).Bind(2, r.job_id).Bind(3, r.attempt).BindDouble(4, r.gpus).Bind(5, r.start_ms).Bind(6, r.end_ms);
  if (i.Step() != SQLITE_DONE) return Error("record usage");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UsageRecord>> Store::UsageSince(int64_t since_ms) {
  ReadTxn t(this);
  Stmt q(t.db(), "SELECT owner, job_id, attempt, gpus, start_ms, end_ms FROM usage WHERE end_ms >= ? ORDER BY end_ms");
  q.Bind(1, since_ms);
  std::vector<UsageRecord> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    out.push_back({q.Text(0), q.Text(1), static_cast<int>(q.Int(2)), q.Double(3), q.Int(4), q.Int(5)});
  }
  if (rc != SQLITE_DONE) return Error(t.db(), "read usage");
  return out;
}

absl::StatusOr<int64_t> Store::LastEventMs(const std::string& id) {
  ReadTxn t(this);
  Stmt q(t.db(), "SELECT MAX(e.unix_ms) FROM events e JOIN jobs j ON e.job_seq = j.seq WHERE j.id = ?");
  q.Bind(1, id);
  if (q.Step() != SQLITE_ROW) return Error(t.db(), "read the last event");
  return q.Int(0);
}

absl::StatusOr<ftd::v1::Job> Store::Get(const std::string& id) {
  ReadTxn r(this);
  auto j = LoadLocked(r.db(), id, nullptr);
  if (!j.ok()) return j.status();
  if (!j->has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " does not exist (ftctl list shows the jobs)"));
  return **j;
}

namespace {

// The statements of one List page. `page` finds the sequences of at most limit + 1 matching jobs,
// in order, from one index: with no filter the primary key, otherwise the jobs_list_* index of the
// filter's columns, run once per state (the filter's states, or every state) and merged. `fetch`
// then reads the records of the jobs on the page, and only those.
struct ListStatements {
  std::string page;
  std::vector<int> states;  // one run of `page` per state; empty: one run without a state
};

ListStatements ListSql(const JobFilter& f) {
  ListStatements out;
  const bool owner = !f.owner.empty(), kind = f.kind != ftd::v1::JOB_KIND_UNSPECIFIED;
  if (!f.states.empty()) {
    for (auto s : f.states) out.states.push_back(s);
  } else if (owner || kind) {
    const auto* d = ftd::v1::JobState_descriptor();
    for (int i = 0; i < d->value_count(); ++i) out.states.push_back(d->value(i)->number());
  }
  std::sort(out.states.begin(), out.states.end());
  out.states.erase(std::unique(out.states.begin(), out.states.end()), out.states.end());
  out.page = "SELECT seq FROM jobs";
  if (!out.states.empty()) {
    absl::StrAppend(&out.page, " INDEXED BY ",
                    owner && kind ? "jobs_list_owner_kind"
                    : owner       ? "jobs_list_owner"
                    : kind        ? "jobs_list_kind"
                                  : "jobs_list_state",
                    " WHERE state = ? AND");
  } else {
    absl::StrAppend(&out.page, " WHERE");
  }
  if (owner) absl::StrAppend(&out.page, " owner = ? AND");
  if (kind) absl::StrAppend(&out.page, " kind = ? AND");
  absl::StrAppend(&out.page, f.newest_first ? " seq < ? ORDER BY seq DESC LIMIT ?" : " seq > ? ORDER BY seq LIMIT ?");
  return out;
}

constexpr const char* kFetchSql = "SELECT job FROM jobs WHERE seq = ?";
constexpr const char* kEventsSql =
    "SELECT e.event FROM events e JOIN jobs j ON e.job_seq = j.seq WHERE j.id = ? AND e.seq > ? "
    "ORDER BY e.seq LIMIT ?";

}  // namespace

absl::StatusOr<std::vector<ftd::v1::Job>> Store::List(const JobFilter& f, int64_t* next_seq) {
  *next_seq = 0;
  if (f.limit < 1) return absl::InvalidArgumentError(absl::StrCat("a page holds at least 1 job (got ", f.limit, ")"));
  const ListStatements sql = ListSql(f);
  // Past the cursor in the chosen order; the first page of newest-first starts after the largest seq.
  const int64_t bound = f.newest_first && f.after_seq <= 0 ? INT64_MAX : f.after_seq;
  ReadTxn txn(this);  // one snapshot for every run and the fetch
  std::vector<int64_t> seqs;
  const size_t runs = std::max<size_t>(sql.states.size(), 1);
  for (size_t r = 0; r < runs; ++r) {
    Stmt q(txn.db(), sql.page.c_str());
    if (!q.ok()) return Error(txn.db(), "prepare list");
    int b = 1;
    if (!sql.states.empty()) q.Bind(b++, sql.states[r]);
    if (!f.owner.empty()) q.Bind(b++, f.owner);
    if (f.kind != ftd::v1::JOB_KIND_UNSPECIFIED) q.Bind(b++, f.kind);
    q.Bind(b++, bound);
    q.Bind(b, int64_t{f.limit} + 1);
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) seqs.push_back(q.Int(0));
    if (rc != SQLITE_DONE) return Error(txn.db(), "list jobs");
  }
  if (f.newest_first) {
    std::sort(seqs.begin(), seqs.end(), std::greater<>());
  } else {
    std::sort(seqs.begin(), seqs.end());
  }
  if (seqs.size() > static_cast<size_t>(f.limit)) {
    seqs.resize(f.limit);
    *next_seq = seqs.back();
  }
  std::vector<ftd::v1::Job> out;
  out.reserve(seqs.size());
  Stmt fetch(txn.db(), kFetchSql);
  for (int64_t seq : seqs) {
    sqlite3_reset(fetch.raw());
    fetch.Bind(1, seq);
    if (fetch.Step() != SQLITE_ROW) return Error(txn.db(), "read listed job");
    ftd::v1::Job job;
    if (!job.ParseFromString(fetch.Blob(0))) {
      return absl::DataLossError(absl::StrCat("database ", path_, ": the record of job seq ", seq, " is corrupt"));
    }
    out.push_back(std::move(job));
  }
  return out;
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

absl::StatusOr<std::vector<std::string>> Store::ListPlan(const JobFilter& f) {
  ReadTxn r(this);
  std::vector<std::string> lines;
  for (const std::string& sql : {ListSql(f).page, std::string(kFetchSql)}) {
    auto p = PlanLocked(r.db(), sql);
    if (!p.ok()) return p.status();
    lines.insert(lines.end(), p->begin(), p->end());
  }
  return lines;
}

absl::StatusOr<std::vector<std::string>> Store::EventsPlan() {
  ReadTxn r(this);
  return PlanLocked(r.db(), kEventsSql);
}

absl::StatusOr<ftd::v1::Job> Store::Update(
    const std::string& id,
    const std::function<absl::Status(ftd::v1::Job&, std::vector<ftd::v1::JobEvent>&)>& mutate, int64_t now_ms) {
  ftd::v1::Job job;
  auto st = InJobTxn(id, [&](int64_t seq, ftd::v1::Job& stored) {
    job = stored;
    std::vector<ftd::v1::JobEvent> events;
    if (auto st = mutate(job, events); !st.ok()) return st;
    if (auto st = SaveLocked(seq, job); !st.ok()) return st;
    for (auto& e : events) {
      if (auto st = AppendLocked(seq, e, now_ms); !st.ok()) return st;
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return job;
}

absl::Status Store::InJobTxn(const std::string& id, const std::function<absl::Status(int64_t, ftd::v1::Job&)>& body) {
  std::lock_guard<std::mutex> l(mu_);
  if (auto st = Begin(); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    Rollback();
    return st;
  };
  int64_t seq = 0;
  auto j = LoadLocked(db_, id, &seq);
  if (!j.ok()) return fail(j.status());
  if (!j->has_value()) return fail(absl::NotFoundError(absl::StrCat("job ", id, " does not exist")));
  if (auto st = body(seq, **j); !st.ok()) return fail(st);
  if (auto st = Commit(); !st.ok()) return fail(st);
  return absl::OkStatus();
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
  if (limit < 1 || limit > kMaxEventsPerRead) {
    return absl::InvalidArgumentError(
        absl::StrCat("events are read 1 to ", kMaxEventsPerRead, " at a time (got ", limit, ")"));
  }
  ReadTxn r(this);
  Stmt q(r.db(), kEventsSql);
  q.Bind(1, id).Bind(2, after_seq).Bind(3, limit);
  std::vector<ftd::v1::JobEvent> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    ftd::v1::JobEvent e;
    if (!e.ParseFromString(q.Blob(0))) return absl::DataLossError(absl::StrCat("an event of job ", id, " is corrupt"));
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return Error(r.db(), "read events");
  return out;
}

absl::Status Store::Delete(const std::string& id) {
  return InJobTxn(id, [&](int64_t seq, ftd::v1::Job& job) {
    if (!IsTerminal(job.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " is ", ftd::v1::JobState_Name(job.state()),
                       ": only finished jobs (SUCCEEDED, FAILED, CANCELLED) can be deleted; cancel it first"));
    }
    const std::pair<const char*, const char*> deletes[] = {{"DELETE FROM events WHERE job_seq = ?", "delete events"},
                                                          {"DELETE FROM jobs WHERE seq = ?", "delete job"}};
    for (const auto& [sql, what] : deletes) {
      Stmt d(db_, sql);
      d.Bind(1, seq);
      if (d.Step() != SQLITE_DONE) return Error(what);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<ftd::v1::Job>> Store::JobsInStates(const std::vector<ftd::v1::JobState>& states) {
  ReadTxn r(this);
  std::vector<ftd::v1::Job> out;
  for (auto s : states) {
    Stmt q(r.db(), "SELECT job FROM jobs WHERE state = ? ORDER BY priority DESC, seq");
    q.Bind(1, s);
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      ftd::v1::Job job;
      if (!job.ParseFromString(q.Blob(0))) return absl::DataLossError("a job record is corrupt");
      out.push_back(std::move(job));
    }
    if (rc != SQLITE_DONE) return Error(r.db(), "jobs by state");
  }
  return out;
}

absl::StatusOr<int64_t> Store::CountInState(ftd::v1::JobState state) {
  ReadTxn r(this);
  Stmt q(r.db(), "SELECT COUNT(*) FROM jobs WHERE state = ?");
  q.Bind(1, state);
  if (q.Step() != SQLITE_ROW) return Error(r.db(), "count jobs");
  return q.Int(0);
}

absl::Status Store::IntegrityCheck() {
  ReadTxn r(this);
  Stmt q(r.db(), "PRAGMA integrity_check");
  if (q.Step() != SQLITE_ROW) return Error(r.db(), "integrity_check");
  if (q.Text(0) != "ok") return absl::DataLossError(q.Text(0));
  return absl::OkStatus();
}

}  // namespace ftd::server
