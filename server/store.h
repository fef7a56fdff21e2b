// The durable job store: one SQLite file (WAL, synchronous=FULL, BEGIN IMMEDIATE for writes).
// Jobs, their event log (state changes, step reports, log lines, results) and the schema version
// live here. A write returns only after its transaction committed. Job ids come from an
// AUTOINCREMENT key and are never reused. No gRPC here; protobuf messages are the record format.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ftd/v1/jobs.pb.h"

namespace ftd::server {

inline constexpr int kSchemaVersion = 1;

struct JobFilter {
  std::vector<ftd::v1::JobState> states;  // empty: all
  std::string owner;                       // empty: all
  ftd::v1::JobKind kind = ftd::v1::JOB_KIND_UNSPECIFIED;
  int64_t after_seq = 0;  // paging: jobs with a larger internal sequence
  int limit = 50;
};

class Store {
 public:
  // Opens or creates the database. A newer schema version or a corrupt file is an error that says so.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Inserts a QUEUED job (its id assigned here) and its first event, or, when request_id is set and
  // already known, returns the existing job with created = false.
  absl::StatusOr<std::pair<ftd::v1::Job, bool>> Insert(ftd::v1::Job job, int64_t now_ms);
  absl::StatusOr<ftd::v1::Job> Get(const std::string& id);
  // Jobs in submission order; *next_seq is the paging cursor (0 at the end).
  absl::StatusOr<std::vector<ftd::v1::Job>> List(const JobFilter& f, int64_t* next_seq);
  // Read-modify-write of one job in one transaction; `mutate` may return an error to abort.
  // `events` are appended to the job's log in the same transaction.
  absl::StatusOr<ftd::v1::Job> Update(const std::string& id,
                                      const std::function<absl::Status(ftd::v1::Job&, std::vector<ftd::v1::JobEvent>&)>& mutate,
                                      int64_t now_ms);
  absl::Status AppendEvent(const std::string& id, ftd::v1::JobEvent event, int64_t now_ms);
  absl::StatusOr<std::vector<ftd::v1::JobEvent>> Events(const std::string& id, int64_t after_seq, int limit);
  // All jobs in the given states, in scheduling order (priority desc, submission asc).
  absl::StatusOr<std::vector<ftd::v1::Job>> JobsInStates(const std::vector<ftd::v1::JobState>& states);
  absl::StatusOr<int64_t> CountInState(ftd::v1::JobState state);
  // PRAGMA integrity_check == "ok".
  absl::Status IntegrityCheck();

 private:
  Store() = default;
  absl::Status Exec(const char* sql);
  absl::Status Begin();
  absl::Status Commit();
  void Rollback();
  absl::Status Migrate();
  absl::StatusOr<std::optional<ftd::v1::Job>> LoadLocked(const std::string& id, int64_t* seq);
  absl::Status SaveLocked(int64_t seq, const ftd::v1::Job& job);
  absl::Status AppendLocked(int64_t job_seq, ftd::v1::JobEvent& e, int64_t now_ms);
  absl::Status Error(const char* what) const;

  std::mutex mu_;
  sqlite3* db_ = nullptr;
  std::string path_;
};

bool IsTerminal(ftd::v1::JobState s);

}  // namespace ftd::server
