// Restart recovery: what a JobManager does with the store a previous daemon left behind. Counts the
// jobs by state, reloads the GPU usage that still counts for quotas and fair share, applies the
// restart policy (requeue or fail, --restart-policy) to jobs left RUNNING after killing their
// orphaned workers, and rebuilds the queue. A policy the full store cannot record yet is kept in
// memory and written by a later Tick().
#include "server/jobs/job_manager.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "server/policy/exit_classification.h"
#include "server/common/log.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

namespace {

constexpr ftd::v1::JobState kStates[] = {ftd::v1::QUEUED, ftd::v1::RUNNING, ftd::v1::SUCCEEDED, ftd::v1::FAILED,
                                         ftd::v1::CANCELLED};

}  // namespace

absl::Status JobManager::Recover() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto s : kStates) {
    auto n = store_->CountInState(s);
    if (!n.ok()) return n.status();
    counts_[s] = *n;
  }
  // Usage that still counts: in the quota window, or not yet decayed to nothing.
  const int64_t now_ms = clock_->UnixMs();
  const int64_t horizon = std::max(cfg_.quotas.window_ms, 10 * cfg_.quotas.half_life_ms);
  auto used = store_->UsageSince(now_ms - horizon);
  if (!used.ok()) return used.status();
  for (const UsageRecord& r : *used) usage_.Add(r.owner, {r.gpus, r.start_ms, r.end_ms});
  auto running = store_->JobsInStates({ftd::v1::RUNNING});
  if (!running.ok()) return running.status();
  for (const Job& j : *running) {
    launcher_->KillOrphan(j.worker_pid(), j.id());
    // Its attempt counts until the last sign of life the store has of it.
    if (auto last = store_->LastEventMs(j.id()); last.ok() && j.started_unix_ms() > 0) {
      const UsageRecord r{j.owner(), j.id(), j.attempt(), 1.0, j.started_unix_ms(),
                          std::max(*last, j.started_unix_ms())};
      if (r.end_ms > r.start_ms && store_->AddUsage(r).ok()) usage_.Add(r.owner, {r.gpus, r.start_ms, r.end_ms});
    }
    if (auto st = RecoverRunningLocked(j); !st.ok()) {
      // A full disk must not keep ftd from starting: reads work, and the restart policy is applied
      // by Tick() once the store takes the write. Until then the job reads RUNNING with no worker.
      metrics_->StoreWriteFailed("state");
      metrics_->UnrecordedOutcomes(++unrecorded_);
      unrecovered_.push_back(j);
      FtdLog() << "CANNOT RECORD that job " << j.id() << " was running when ftd restarted: " << st
               << "; starting anyway, keeping it in memory and trying again every second";
    }
  }
  auto queued = store_->JobsInStates({ftd::v1::QUEUED});
  if (!queued.ok()) return queued.status();
  for (const Job& j : *queued) {
    std::lock_guard<std::mutex> view(view_mu_);
    if (!queue_.Put(j)) return absl::DataLossError(absl::StrCat("queued job has a malformed id \"", j.id(), "\""));
  }
  PublishGaugesLocked();
  return absl::OkStatus();
}

absl::Status JobManager::RecoverRunningLocked(const Job& j) {
  const bool attempts_left = j.attempt() < j.max_attempts();
  const bool requeue = cfg_.requeue_on_restart && attempts_left;
  auto job = TransitionLocked(j.id(), [&](Job& job) {
    const std::string what =
        absl::StrCat("ftd restarted while attempt ", job.attempt(), " of ", job.max_attempts(), " was running; ");
    job.set_worker_pid(0);
    job.set_reason(std::string(Info(Reason::kDaemonRestart).code));
    if (requeue) {
      job.set_state(ftd::v1::QUEUED);
      job.set_message(absl::StrCat(what, "requeued"));
    } else {
      job.set_state(ftd::v1::FAILED);
      job.set_finished_unix_ms(clock_->UnixMs());
      job.set_message(absl::StrCat(what, attempts_left ? "not requeued (--restart-policy fail)" : "no attempts left"));
      job.mutable_result()->set_outcome(RunResult::FAILED);
      job.mutable_result()->set_message(job.message());
    }
    return absl::OkStatus();
  });
  if (!job.ok()) return job.status();
  if (requeue) metrics_->Retry(Info(Reason::kDaemonRestart).code);
  if (!requeue) metrics_->JobFinished(ftd::v1::FAILED, Info(Reason::kDaemonRestart).code, 0);
  if (job->state() == ftd::v1::QUEUED) {
    std::lock_guard<std::mutex> view(view_mu_);
    queue_.Put(*job);
  }
  return absl::OkStatus();
}

}  // namespace ftd::server
