// GPU time of ended attempts in the store (store.h): one record per attempt, read back from a time
// on at start for quotas and fair share.
#include "server/store/store.h"

#include "server/common/sqlite_stmt.h"

namespace ftd::server {

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

}  // namespace ftd::server
