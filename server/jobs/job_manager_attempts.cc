// An attempt's life in the daemon: started from a placement (the job RUNNING, its slots taken, its
// usage opened), launched (its pid recorded, or a launch failure classified), cancelled (while
// queued, while launching or while running, with or without a checkpoint), and ended: the worker's
// exit classified (exit_classification.h) into a retry with backoff, a free requeue or a final
// state, written to the store with its result, its slots and usage released. An outcome the store
// refuses stays in memory and Tick() writes it later.
#include "server/jobs/job_manager.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/policy/exit_classification.h"
#include "server/jobs/job_events.h"
#include "server/common/log.h"
#include "spec/spec.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

absl::StatusOr<LaunchRequest> JobManager::StartLocked(const Placement& p) {
  const std::string& job_id = p.job_id;
  const std::string& slot = p.slot;
  std::vector<std::string> all = {slot};
  all.insert(all.end(), p.more_slots.begin(), p.more_slots.end());
  const std::string where = absl::StrJoin(all, "+");
  const int64_t now = clock_->UnixMs();
  auto job = TransitionLocked(job_id, [&](Job& job) {
    if (job.state() != ftd::v1::QUEUED) return absl::FailedPreconditionError("no longer queued");
    job.set_state(ftd::v1::RUNNING);
    job.set_attempt(job.attempt() + 1);
    job.set_slot(slot);
    job.set_started_unix_ms(now);
    job.set_reason("RUNNING");
    job.set_message(absl::StrCat("attempt ", job.attempt(), " of ", job.max_attempts(), " on ", where));
    job.set_queue_position(0);
    return absl::OkStatus();
  });
  if (!job.ok()) return job.status();
  // The GPUs it counts for: a whole one, or its predicted share of one it may share.
  const QueuedJob* queued = queue_.Find(job_id);
  const int64_t gpu_bytes = queued != nullptr ? queued->gpu_bytes : -1;
  double gpus = 1;
  if (cfg_.jobs_per_gpu > 1 && gpu_bytes >= 0) {
    gpus = gpu_bytes > 0 && cfg_.memory.gpu_bytes > 0
               ? std::min(1.0, static_cast<double>(gpu_bytes) / static_cast<double>(cfg_.memory.gpu_bytes))
               : 1.0 / cfg_.jobs_per_gpu;
  }
  if (!p.more_slots.empty()) gpus = static_cast<double>(1 + p.more_slots.size());  // whole GPUs
  {
    std::lock_guard<std::mutex> view(view_mu_);
    queue_.Remove(job_id);
    const bool whole = !p.more_slots.empty();
    slot_use_[slot] = {job_id, job->owner(), gpu_bytes, true, whole};
    for (const auto& s : p.more_slots) slot_use_[s] = {job_id, job->owner(), gpu_bytes, false, true};
    usage_.Open(job_id, job->owner(), gpus, now);
  }
  PublishGpusLocked();
  metrics_->QueueWait((now - std::max(job->created_unix_ms(), job->not_before_unix_ms())) / 1000.0);
  Attempt a;
  a.job_id = job_id;
  a.token = NewToken();
  a.slot = slot;
  a.owner = job->owner();
  a.gpu = p.gpu;
  a.gpus = gpus;
  a.more_slots = p.more_slots;
  a.kernel_set = ftd::spec::KernelSetOf(job->spec());
  a.attempt = job->attempt();
  a.totals.step = job->last_step().step();
  a.totals.tokens = job->last_step().tokens_total();
  a.started_ms = now;
  a.last_seen_ms = clock_->SteadyMs();
  running_[job_id] = a;
  std::optional<uid_t> owner_uid;
  if (job->has_owner_uid()) owner_uid = job->owner_uid();
  return LaunchRequest{job_id, a.attempt, a.token, slot, p.gpu, p.more_slots, p.more_gpus,
                       std::max(1, job->spec().gpus()), owner_uid};
}

void JobManager::Launched(const LaunchRequest& req, const absl::StatusOr<int64_t>& pid) {
  bool kick = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    LaunchedLocked(req, pid, &kick);
  }
  if (kick) Kick();  // its slot is free again
}

void JobManager::LaunchedLocked(const LaunchRequest& req, const absl::StatusOr<int64_t>& pid, bool* kick) {
  auto it = running_.find(req.job_id);
  if (it == running_.end() || it->second.attempt != req.attempt || it->second.pid != 0) return;  // ended already
  Attempt& a = it->second;
  if (!pid.ok()) {
    WorkerEnd end;
    end.cancel = a.cancel;
    end.drain = a.drain;
    end.started = false;
    end.start_error = std::string(pid.status().message());
    // The launcher says RESOURCE_EXHAUSTED when ftd itself ran out (descriptors, memory for a pipe).
    end.start_short = absl::IsResourceExhausted(pid.status());
    FinishLocked(a, end);
    *kick = true;
    return;
  }
  a.pid = *pid;
  a.last_seen_ms = clock_->SteadyMs();
  if (a.cancel || a.drain) launcher_->Stop(a.pid, std::chrono::milliseconds(cfg_.grace_ms), StopModeLocked(a));
  auto st = store_->Update(
      a.job_id,
      [&](Job& j, std::vector<JobEvent>&) {
        j.set_worker_pid(a.pid);
        return absl::OkStatus();
      },
      clock_->UnixMs());
  if (!st.ok()) {
    metrics_->StoreWriteFailed("state");
    FtdLog() << "cannot record the worker pid of " << a.job_id << ": " << st.status();
  }
}

StopMode JobManager::StopModeLocked(const Attempt& a) {
  return a.drain || a.checkpoint_on_stop ? StopMode::kCheckpoint : StopMode::kNoCheckpoint;
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& id, const std::string& cancelled_by, bool checkpoint) {
  std::lock_guard<std::mutex> l(mu_);
  if (queue_.Contains(id)) {
    auto job = TransitionLocked(id, [&](Job& job) {
      job.set_state(ftd::v1::CANCELLED);
      job.set_reason(std::string(Info(Reason::kCancelled).code));
      job.set_message("cancelled while queued");
      job.set_cancelled_by(cancelled_by);
      job.set_finished_unix_ms(clock_->UnixMs());
      job.mutable_result()->set_outcome(RunResult::CANCELLED);
      job.mutable_result()->set_message(job.message());
      return absl::OkStatus();
    });
    if (!job.ok()) return job.status();
    std::lock_guard<std::mutex> view(view_mu_);
    queue_.Remove(id);
    metrics_->JobFinished(ftd::v1::CANCELLED, Info(Reason::kCancelled).code, 0);
    return job;
  }
  auto it = running_.find(id);
  if (it != running_.end()) {
    Attempt& a = it->second;
    if (a.unrecorded.has_value()) {
      // The worker is gone and its outcome waits in memory for the store. A final outcome stays
      // what it is; one that would be retried is cancelled instead.
      const Verdict v = Classify(*a.unrecorded, a.attempt, cfg_.heartbeat_timeout_ms / 1000.0);
      const bool retry = Info(v.reason).retry != Retry::kNever;
      if (retry) a.unrecorded->cancel = true;
      auto job = store_->Get(id);
      if (!job.ok()) return job.status();
      job->set_message(absl::StrCat("the worker has ended (", std::string(Info(v.reason).code), ": ", v.message,
                                    "); ftd cannot write that to its store yet and keeps it in memory until it can",
                                    retry ? "; cancelled: it will not be retried" : ""));
      return job;
    }
    a.cancel = true;
    a.checkpoint_on_stop = checkpoint;
    if (a.pid > 0) launcher_->Stop(a.pid, std::chrono::milliseconds(cfg_.grace_ms), StopModeLocked(a));
    // else: once launched
    const std::string stopping =
        checkpoint ? absl::StrCat("stopping the worker after a checkpoint (SIGTERM; SIGKILL once it shows no "
                                  "progress for ", cfg_.grace_ms / 1000.0, "s)")
                   : absl::StrCat("stopping the worker at its next step, without a checkpoint (SIGUSR1; SIGKILL "
                                  "after ", cfg_.grace_ms / 1000.0, "s)");
    auto job = TransitionLocked(id, [&](Job& job) {
      job.set_reason("CANCELLING");
      job.set_cancelled_by(cancelled_by);
      job.set_message(stopping);
      return absl::OkStatus();
    });
    if (job.ok()) return job;
    // The cancel goes on all the same; its outcome is written once the store takes it.
    metrics_->StoreWriteFailed("state");
    FtdLog() << "cannot record the cancel of job " << id << ": " << job.status()
             << "; the worker is being stopped anyway";
    auto stored = store_->Get(id);
    if (!stored.ok()) return stored.status();
    stored->set_reason("CANCELLING");
    stored->set_cancelled_by(cancelled_by);
    stored->set_message(absl::StrCat(stopping, "; not yet written to ftd's store: ", job.status().message()));
    return stored;
  }
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  if (IsTerminal(job->state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ", StateLabel(job->state()),
                                                      "; only queued or running jobs can be cancelled"));
  }
  return absl::InternalError(absl::StrCat("job ", id, " is ", ftd::v1::JobState_Name(job->state()),
                                          " in the database but neither queued nor running in ftd"));
}

void JobManager::OnWorkerExit(const std::string& job_id, int attempt, ExitStatus st) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = running_.find(job_id);
    if (it == running_.end() || it->second.attempt != attempt) return;
    Attempt& a = it->second;
    WorkerEnd end;
    end.drain = a.drain;
    end.cancel = a.cancel;
    end.heartbeat_lost = a.lost;
    end.no_progress = a.stuck;
    if (a.stuck) {
      end.no_progress_detail = absl::StrCat("no step and no load or checkpoint progress for ",
                                            cfg_.progress_timeout_ms / 1000.0, " s (--progress-timeout-s); last: ",
                                            a.last_progress);
    }
    end.result = a.result;
    end.exit = st;
    FinishLocked(a, end);
  }
  Kick();
}

bool JobManager::FinishLocked(Attempt& a, const WorkerEnd& end) {
  const Verdict v = Classify(end, a.attempt, cfg_.heartbeat_timeout_ms / 1000.0);
  const ReasonInfo& info = Info(v.reason);
  const int64_t now = clock_->UnixMs();
  if (a.ended_ms == 0) a.ended_ms = now;
  bool retried = false;
  auto job = TransitionLocked(a.job_id, [&](Job& job) {
    job.set_worker_pid(0);
    job.set_reason(std::string(info.code));
    if (info.retry == Retry::kWhileAttemptsLeft && job.attempt() < job.max_attempts()) {
      job.set_state(ftd::v1::QUEUED);
      job.set_not_before_unix_ms(now + RetryDelayMs(job.attempt(), cfg_.backoff_base_ms, cfg_.backoff_max_ms));
      job.set_message(absl::StrCat("attempt ", job.attempt(), " of ", job.max_attempts(), " failed: ", v.message,
                                   "; retrying"));
      retried = true;
    } else if (info.retry == Retry::kFree) {
      job.set_state(ftd::v1::QUEUED);
      job.set_attempt(job.attempt() - 1);  // not the job's failure: the attempt does not count
      job.set_message(v.message);
    } else if (info.retry == Retry::kFreeAfterBackoff) {
      // Not the job's failure either, but trying again at once would most likely fail the same way.
      const int in_a_row = short_starts_[a.job_id] + 1;
      const int64_t wait_ms = RetryDelayMs(in_a_row, cfg_.backoff_base_ms, cfg_.backoff_max_ms);
      job.set_state(ftd::v1::QUEUED);
      job.set_attempt(job.attempt() - 1);
      job.set_not_before_unix_ms(now + wait_ms);
      job.set_message(absl::StrCat(v.message, " in ", wait_ms / 1000.0, " s (", in_a_row, " in a row)"));
    } else {
      job.set_state(info.final_state);
      job.set_finished_unix_ms(now);
      job.set_message(info.retry == Retry::kWhileAttemptsLeft
                          ? absl::StrCat(v.message, " (attempt ", job.attempt(), " of ", job.max_attempts(),
                                         "; no retries left)")
                          : v.message);
      // The worker's own result where it decided the outcome; otherwise one that says what happened.
      RunResult res;
      if (v.from_report && end.result.has_value()) {
        res = *end.result;
      } else {
        if (end.result.has_value()) res = *end.result;  // keeps steps_done and the last checkpoint
        res.set_outcome(info.final_state == ftd::v1::CANCELLED ? RunResult::CANCELLED : RunResult::FAILED);
        res.set_message(job.message());
      }
      *job.mutable_result() = res;
    }
    return absl::OkStatus();
  });
  if (!job.ok()) {
    // The truth stays here (the attempt keeps its slot) and Tick() writes it once the store takes it.
    metrics_->StoreWriteFailed("state");
    if (a.unrecorded_tries++ % 60 == 0) {
      FtdLog() << "CANNOT RECORD the outcome of job " << a.job_id << " (" << info.code << ": " << v.message
               << "): " << job.status() << "; keeping it in memory and trying again every second";
    }
    const bool first = !a.unrecorded.has_value();
    a.unrecorded = end;
    if (first) metrics_->UnrecordedOutcomes(++unrecorded_);
    return false;
  }
  if (a.unrecorded.has_value()) {
    FtdLog() << "recorded the outcome of job " << a.job_id << " (" << info.code << ") after "
             << a.unrecorded_tries << " failed write(s)";
    metrics_->UnrecordedOutcomes(--unrecorded_);
  }
  if (retried) metrics_->Retry(info.code);
  if (info.retry == Retry::kFreeAfterBackoff) {
    ++short_starts_[a.job_id];
  } else {
    short_starts_.erase(a.job_id);
  }
  UsageInterval used;
  {
    std::lock_guard<std::mutex> view(view_mu_);
    if (job->state() == ftd::v1::QUEUED) queue_.Put(*job);
    if (IsTerminal(job->state())) metrics_->JobFinished(job->state(), info.code, (now - a.started_ms) / 1000.0);
    metrics_->SlotIdle(a.slot);
    slot_use_.erase(a.slot);
    for (const auto& s : a.more_slots) slot_use_.erase(s);
    used = usage_.Close(a.job_id, a.ended_ms);
    phases_.erase(a.job_id);
  }
  // The usage record is history for quotas and fair share; a failed write costs that history only.
  if (used.gpus > 0) {
    if (auto st = store_->AddUsage({a.owner, a.job_id, a.attempt, used.gpus, used.start_ms, used.end_ms}); !st.ok()) {
      metrics_->StoreWriteFailed("usage");
      FtdLog() << "cannot record the GPU usage of job " << a.job_id << ": " << st;
    }
  }
  PublishGpusLocked();
  running_.erase(a.job_id);  // `a` is gone from here on
  exits_cv_.notify_all();
  return true;
}

}  // namespace ftd::server
