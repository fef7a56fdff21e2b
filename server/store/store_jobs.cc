// One job in the store (store.h): its record inserted (with the queue limits and the request id's
// look-up in the insert's transaction), read, changed together with the events the change appends,
// its event log read in order, and a finished job deleted with its events.
#include "server/store/store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/common/sqlite_stmt.h"

namespace ftd::server {

namespace {

constexpr const char* kEventsSql =
    "SELECT e.event FROM events e JOIN jobs j ON e.job_seq = j.seq WHERE j.id = ? AND e.seq > ? "
    "ORDER BY e.seq LIMIT ?";

}  // namespace

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
  // Request ids are the owner's own: another owner's job with the same id is not this request's.
  if (!job.request_id().empty()) {
    Stmt q(db_, "SELECT id FROM jobs WHERE owner = ? AND request_id = ?");
    q.Bind(1, job.owner()).Bind(2, job.request_id());
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

absl::StatusOr<ftd::v1::Job> Store::Get(const std::string& id) {
  ReadTxn r(this);
  auto j = LoadLocked(r.db(), id, nullptr);
  if (!j.ok()) return j.status();
  if (!j->has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " does not exist (ftctl list shows the jobs)"));
  return **j;
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

absl::StatusOr<std::vector<std::string>> Store::EventsPlan() {
  ReadTxn r(this);
  return PlanLocked(r.db(), kEventsSql);
}

}  // namespace ftd::server
