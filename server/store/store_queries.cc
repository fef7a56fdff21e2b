// Reads across the store's jobs (store.h): a page of List from one index per state (merged, with
// its cursor), its query plan, the jobs in given states (restart recovery), the count per state,
// and a job's last event time.
#include "server/store/store.h"

#include <algorithm>
#include <climits>
#include <functional>

#include "absl/strings/str_cat.h"
#include "server/common/sqlite_stmt.h"

namespace ftd::server {

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

absl::StatusOr<int64_t> Store::LastEventMs(const std::string& id) {
  ReadTxn t(this);
  Stmt q(t.db(), "SELECT MAX(e.unix_ms) FROM events e JOIN jobs j ON e.job_seq = j.seq WHERE j.id = ?");
  q.Bind(1, id);
  if (q.Step() != SQLITE_ROW) return Error(t.db(), "read the last event");
  return q.Int(0);
}

}  // namespace ftd::server
