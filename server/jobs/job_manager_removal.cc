// Removing finished jobs: Delete (one job, its events and its directory), Prune (those a filter
// selects, or what they would free with dry_run) and RunRetention (what retention_ms outlived, plus
// partial checkpoints of jobs not running and directories of jobs the store no longer has).
#include "server/jobs/job_manager.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_events.h"
#include "server/store/job_files.h"
#include "server/common/log.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

absl::StatusOr<int64_t> JobManager::DeleteLocked(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  if (running_.count(id) != 0 && IsTerminal(job->state())) {
    return absl::UnavailableError(absl::StrCat("job ", id, " is still being recorded; delete it again in a moment"));
  }
  if (auto st = store_->Delete(id); !st.ok()) return st;  // refuses a job that has not finished
  --counts_[job->state()];
  PublishGaugesLocked();
  hub_.Publish(id);  // ends the watches of the job (it no longer exists)
  auto freed = RemoveTree(JobDir(id));
  if (!freed.ok()) {
    // The record is gone; the next retention run removes the directory of a job the store no longer has.
    FtdLog() << "job " << id << " deleted, but " << freed.status().message();
    return int64_t{0};
  }
  FtdLog() << "job " << id << " deleted (" << ftd::v1::JobState_Name(job->state()) << ", " << *freed
           << " bytes of files)";
  return *freed;
}

absl::StatusOr<Removed> JobManager::Delete(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  auto freed = DeleteLocked(id);
  if (!freed.ok()) return freed.status();
  return Removed{{id}, *freed};
}

absl::StatusOr<Removed> JobManager::Prune(const PruneFilter& f) {
  for (auto s : f.states) {
    if (!IsTerminal(s)) {
      return absl::InvalidArgumentError(absl::StrCat("states: only finished jobs can be pruned (SUCCEEDED, FAILED, ",
                                                     "CANCELLED), not ", ftd::v1::JobState_Name(s)));
    }
  }
  if (f.older_than_ms < 0) return absl::InvalidArgumentError("older_than_seconds must be >= 0");
  JobFilter lf;
  lf.states = f.states.empty() ? std::vector<ftd::v1::JobState>{ftd::v1::SUCCEEDED, ftd::v1::FAILED, ftd::v1::CANCELLED}
                               : f.states;
  lf.owner = f.owner;
  lf.limit = 500;
  const int64_t cutoff = clock_->UnixMs() - f.older_than_ms;
  std::vector<std::string> ids;
  for (;;) {
    int64_t next = 0;
    auto page = store_->List(lf, &next);
    if (!page.ok()) return page.status();
    for (const Job& j : *page) {
      if (j.finished_unix_ms() <= cutoff) ids.push_back(j.id());
    }
    if (next == 0) break;
    lf.after_seq = next;
  }
  Removed out;
  if (f.dry_run) {
    for (const auto& id : ids) out.freed_bytes += TreeBytes(JobDir(id));
    out.ids = std::move(ids);
    return out;
  }
  for (const auto& id : ids) {
    std::lock_guard<std::mutex> l(mu_);
    auto freed = DeleteLocked(id);
    if (!freed.ok()) {
      if (absl::IsNotFound(freed.status())) continue;  // deleted meanwhile
      return freed.status();
    }
    out.ids.push_back(id);
    out.freed_bytes += *freed;
  }
  return out;
}

absl::StatusOr<Removed> JobManager::RunRetention() {
  PruneFilter f;
  f.older_than_ms = cfg_.retention_ms;
  auto out = Prune(f);
  if (!out.ok()) return out.status();
  // Leftovers: partial checkpoints of jobs not running, directories of jobs the store no longer has.
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(cfg_.data_dir) / "jobs", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string id = it->path().filename().string();
    if (id.empty() || id[0] == '.') continue;  // staging areas
    std::lock_guard<std::mutex> l(mu_);
    if (running_.count(id) != 0) continue;
    auto job = store_->Get(id);
    if (absl::IsNotFound(job.status())) {
      auto freed = RemoveTree(it->path().string());
      if (freed.ok()) out->freed_bytes += *freed;
      continue;
    }
    // Beneath the data directory, never through a link its worker's user swapped in.
    out->freed_bytes += RemovePartialCheckpoints(cfg_.data_dir, absl::StrCat("jobs/", id, "/checkpoints"));
  }
  if (!out->ids.empty() || out->freed_bytes > 0) {
    FtdLog() << "retention: deleted " << out->ids.size() << " job(s) finished over "
             << cfg_.retention_ms / 1000 << " s ago, freed " << out->freed_bytes << " bytes";
  }
  return out;
}

}  // namespace ftd::server
