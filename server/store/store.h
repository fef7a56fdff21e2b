// The durable job store: one SQLite file (WAL, synchronous=FULL, BEGIN IMMEDIATE for writes).
// Jobs, their event log (state changes, step reports, log lines, results) and the schema version
// live here. A write returns only after its transaction committed; a failed write leaves nothing
// behind. Job ids come from an AUTOINCREMENT key and are never reused. No gRPC here; protobuf
// messages are the record format.
//
// Costs: every query is an index search (Plan() shows them). A page of List costs O(page) whatever
// the number of jobs stored, and Events reads at most kMaxEventsPerRead rows.
//
// Errors: a full disk (SQLITE_FULL, ENOSPC, EDQUOT) is RESOURCE_EXHAUSTED naming the filesystem and
// the data directory; the transaction is rolled back and the store is usable again once there is
// space. A corrupt file is DATA_LOSS, a lock held too long UNAVAILABLE, anything else INTERNAL.
#pragma once

#include <sqlite3.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ftd/v1/jobs.pb.h"

namespace ftd::server {

// 1: jobs, events, meta. 2: indexes for listing by state, owner and kind in submission order.
// 3: usage (GPU time of ended attempts, by owner).
inline constexpr int kSchemaVersion = 4;
// The most events one Events() call returns.
inline constexpr int kMaxEventsPerRead = 1000;
// Read connections (reads run concurrently with each other and with the one writer).
inline constexpr int kReadConnections = 4;

struct JobFilter {
  std::vector<ftd::v1::JobState> states;  // empty: all
  std::string owner;                       // empty: all
  ftd::v1::JobKind kind = ftd::v1::JOB_KIND_UNSPECIFIED;  // UNSPECIFIED: all
  bool newest_first = false;  // order: submission order (oldest first), or the reverse
  // Paging cursor: the sequence of the last job of the previous page (the `next_seq` List gave);
  // 0 for the first page. A page holds the jobs that come after it in the chosen order.
  int64_t after_seq = 0;
  int limit = 50;  // jobs per page, ≥ 1
};

// The GPU time of one ended attempt (quotas and fair share; usage_ledger.h).
struct UsageRecord {
  std::string owner, job_id;
  int attempt = 0;
  double gpus = 0;       // GPUs held, a fraction when shared
  int64_t start_ms = 0;  // unix ms
  int64_t end_ms = 0;
};

class Store {
 public:
  // Opens or creates the database and upgrades an older schema in place. A newer schema version or
  // a corrupt file is an error that says so.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // In one transaction: when request_id is set and already names a job of the same owner (request
  // ids are per owner), returns the existing job with
  // created = false (whether or not the queue is full); otherwise, when `job` is QUEUED and
  // `max_queued` jobs are already QUEUED, RESOURCE_EXHAUSTED; otherwise inserts the job (its id
  // assigned here) and its first event and returns it with created = true. `max_queued_owner` (0:
  // none) bounds the QUEUED jobs of the job's owner the same way.
  absl::StatusOr<std::pair<ftd::v1::Job, bool>> Insert(ftd::v1::Job job, int64_t now_ms, int64_t max_queued,
                                                       int64_t max_queued_owner = 0);
  absl::StatusOr<ftd::v1::Job> Get(const std::string& id);
  // One page of the jobs that match `f`, in its order; *next_seq is the cursor of the next page
  // (0 when this page is the last).
  absl::StatusOr<std::vector<ftd::v1::Job>> List(const JobFilter& f, int64_t* next_seq);
  // Read-modify-write of one job in one transaction; `mutate` may return an error to abort.
  // `events` are appended to the job's log in the same transaction.
  absl::StatusOr<ftd::v1::Job> Update(const std::string& id,
                                      const std::function<absl::Status(ftd::v1::Job&, std::vector<ftd::v1::JobEvent>&)>& mutate,
                                      int64_t now_ms);
  absl::Status AppendEvent(const std::string& id, ftd::v1::JobEvent event, int64_t now_ms);
  // The job's events with a sequence above `after_seq`, in order: `limit` of them (1 to
  // kMaxEventsPerRead), fewer only when no more exist.
  absl::StatusOr<std::vector<ftd::v1::JobEvent>> Events(const std::string& id, int64_t after_seq, int limit);
  // Deletes a finished job (SUCCEEDED, FAILED or CANCELLED) and all its events in one transaction.
  // NOT_FOUND for an unknown id, FAILED_PRECONDITION for a job that has not finished. Its id is never
  // reused; its request_id is forgotten (a later submit with it creates a new job).
  absl::Status Delete(const std::string& id);
  // All jobs in the given states, in scheduling order (priority desc, submission asc).
  absl::StatusOr<std::vector<ftd::v1::Job>> JobsInStates(const std::vector<ftd::v1::JobState>& states);
  absl::StatusOr<int64_t> CountInState(ftd::v1::JobState state);
  // Usage of ended attempts: kept when their jobs are deleted (it is the users' history).
  absl::Status AddUsage(const UsageRecord& r);
  // Every record that ended at or after `since_ms`.
  absl::StatusOr<std::vector<UsageRecord>> UsageSince(int64_t since_ms);
  // The time of the job's newest event (0 if it has none): when a job found RUNNING at start last
  // showed signs of life.
  absl::StatusOr<int64_t> LastEventMs(const std::string& id);
  // PRAGMA integrity_check == "ok".
  absl::Status IntegrityCheck();

  // The SQLite query plans (EXPLAIN QUERY PLAN lines) of the statements that List(f) and Events()
  // run, for tests and diagnosis: each line is an index SEARCH, never a SCAN of a table or a sort.
  absl::StatusOr<std::vector<std::string>> ListPlan(const JobFilter& f);
  absl::StatusOr<std::vector<std::string>> EventsPlan();

 private:
  Store() = default;
  absl::Status Exec(const char* sql);
  absl::Status Begin();
  absl::Status Commit();
  void Rollback();
  absl::Status Migrate();
  absl::StatusOr<std::optional<ftd::v1::Job>> LoadLocked(sqlite3* db, const std::string& id, int64_t* seq);
  // One write transaction on job `id`: loads it (NotFound if absent), runs `body` with its row's
  // seq and record, and commits; any failure rolls the whole transaction back.
  absl::Status InJobTxn(const std::string& id, const std::function<absl::Status(int64_t, ftd::v1::Job&)>& body);
  absl::Status SaveLocked(int64_t seq, const ftd::v1::Job& job);
  absl::Status AppendLocked(int64_t job_seq, ftd::v1::JobEvent& e, int64_t now_ms);
  absl::StatusOr<std::vector<std::string>> PlanLocked(sqlite3* db, const std::string& sql);
  absl::Status Error(sqlite3* db, const char* what) const;
  absl::Status Error(const char* what) const { return Error(db_, what); }

  // One connection of the read pool, held for the object's life and inside one read transaction:
  // its queries see one snapshot, the last commit when it began.
  class ReadTxn {
   public:
    explicit ReadTxn(Store* s);
    ~ReadTxn();
    ReadTxn(const ReadTxn&) = delete;
    ReadTxn& operator=(const ReadTxn&) = delete;
    sqlite3* db() const { return db_; }

   private:
    Store* s_;
    sqlite3* db_;
  };

  // Writes go through db_, one at a time (mu_). Reads go through a pool of connections of their
  // own: with WAL, a reader neither waits for a writer's commit (and its fsync) nor blocks it.
  std::mutex mu_;
  sqlite3* db_ = nullptr;
  std::string path_;
  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::vector<sqlite3*> readers_;  // all of them
  std::vector<sqlite3*> idle_;     // those not leased
};

bool IsTerminal(ftd::v1::JobState s);

}  // namespace ftd::server
