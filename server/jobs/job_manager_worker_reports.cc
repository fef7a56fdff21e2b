// The worker side of the protocol: a worker's hello checked against the attempt ftd runs (token and
// attempt number), its assignment (spec, checkpoint directory, the sandbox's roots, the trace path),
// and each message it sends: heartbeats and progress for the watchdog, a stop's checkpoint write
// postponing the kill, the phase shown in Job.phase, step lines in the job's log, and the events and
// metrics of its steps, profiles and logs.
#include "server/jobs/job_manager.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_events.h"
#include "server/store/job_files.h"
#include "server/common/log.h"
#include "server/requests/request_limits.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

absl::StatusOr<JobManager::Attempt*> JobManager::HeardFromLocked(const ftd::v1::WorkerHello& hello) {
  auto it = running_.find(hello.job_id());
  if (it == running_.end() || it->second.attempt != hello.attempt() || it->second.token != hello.token() ||
      it->second.unrecorded.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat("attempt ", hello.attempt(), " of job ", hello.job_id(),
                                                    " is not the one ftd is running"));
  }
  it->second.last_seen_ms = clock_->SteadyMs();
  return &it->second;
}

absl::StatusOr<ftd::v1::Assignment> JobManager::Assign(const ftd::v1::WorkerHello& hello) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto a = HeardFromLocked(hello); !a.ok()) return a.status();
  }
  auto job = store_->Get(hello.job_id());
  if (!job.ok()) return job.status();
  ftd::v1::Assignment as;
  as.set_job_id(job->id());
  as.set_name(job->name());
  *as.mutable_spec() = job->spec();
  as.set_checkpoint_dir((fs::path(JobDir(job->id())) / "checkpoints").string());
  if (cfg_.sandbox.enabled()) {
    auto roots = cfg_.sandbox.RootsFor(job->owner());
    if (!roots.ok()) return roots.status();
    if (!roots->writable.empty()) as.add_writable_roots(roots->writable);
    as.add_writable_roots(JobDir(job->id()));
    for (const std::string& r : roots->read_only) as.add_read_only_roots(r);
  }
  if (job->kind() == ftd::v1::PROFILE) {
    as.set_profile(true);
    as.set_trace_path((fs::path(JobDir(job->id())) / "trace.json").string());
  }
  return as;
}

absl::StatusOr<bool> JobManager::OnWorkerMessage(const ftd::v1::WorkerMessage& msg) {
  const auto& hello = msg.hello();
  std::lock_guard<std::mutex> l(mu_);
  auto found = HeardFromLocked(hello);
  if (!found.ok()) return found.status();
  Attempt* a = *found;
  if (msg.has_started() || msg.has_step() || msg.has_progress()) {
    a->watched = true;
    a->last_progress_ms = a->last_seen_ms;
    if (msg.has_step()) a->last_progress = absl::StrCat("step ", msg.step().step());
    if (msg.has_progress()) {
      const auto& p = msg.progress();
      a->last_progress = p.phase() == "train" ? absl::StrCat("step ", p.step())
                                              : absl::StrCat(Clip(p.phase(), 64), " ", p.done_bytes(), " of ",
                                                             p.total_bytes(), " bytes after step ", p.step());
    }
  }
  if (msg.has_result()) {
    a->result = msg.result();
    a->result->set_message(Clip(a->result->message(), kMaxWorkerText));
  }
  if ((msg.has_step() || (msg.has_progress() && msg.progress().phase() == "save_checkpoint")) &&
      (a->cancel || a->drain) && a->pid > 0 && StopModeLocked(*a) == StopMode::kCheckpoint) {
    // A worker stopping with a checkpoint is not killed while it finishes its step and writes.
    // The postponement covers the write's predicted end where the worker has one.
    a->progress_ms = a->last_seen_ms;
    int64_t wait_ms = cfg_.grace_ms;
    if (msg.has_progress() && msg.progress().has_eta_s() && std::isfinite(msg.progress().eta_s())) {
      wait_ms = std::max<int64_t>(wait_ms, static_cast<int64_t>(std::min(msg.progress().eta_s(), 86400.0) * 1500));
    }
    launcher_->Postpone(a->pid, std::chrono::milliseconds(wait_ms));
  }
  if (msg.has_step()) AppendToLog(hello.job_id(), StepLine(msg.step()));
  // A checkpoint write's predicted end, said once per write (the first report that has one).
  std::optional<std::string> note;
  if (msg.has_progress() && msg.progress().phase() == "save_checkpoint") {
    const auto& p = msg.progress();
    if (p.done_bytes() == 0) a->write_noted = false;
    if (p.has_eta_s() && !a->write_noted && p.done_bytes() < p.total_bytes()) {
      a->write_noted = true;
      note = CheckpointWriteNote(p);
      AppendToLog(hello.job_id(), absl::StrCat("[ftd] ", *note));
    }
  }
  if (msg.has_step() || msg.has_progress()) {
    std::lock_guard<std::mutex> view(view_mu_);
    if (msg.has_step() || msg.progress().phase() == "train") {
      phases_.erase(hello.job_id());
    } else {
      const auto& p = msg.progress();
      ftd::v1::JobPhase& ph = phases_[hello.job_id()];
      ph.set_phase(Clip(p.phase(), 64));
      ph.set_done_bytes(p.done_bytes());
      ph.set_total_bytes(p.total_bytes());
      ph.set_after_step(p.step());
      if (p.has_eta_s()) ph.set_eta_s(p.eta_s()); else ph.clear_eta_s();
    }
  }
  if (msg.has_step() || msg.has_log() || msg.has_profile() || note) {
    JobEvent e;
    if (note) {
      e.set_log(*note);
    } else if (msg.has_step()) {
      *e.mutable_step() = msg.step();
      metrics_->Step(a->slot, a->kernel_set, msg.step(), a->totals.Advance(msg.step()));
    } else if (msg.has_profile()) {
      *e.mutable_profile() = msg.profile();
      metrics_->Profile(a->kernel_set, msg.profile());
    } else {
      e.set_log(Clip(msg.log(), kMaxWorkerText));
    }
    if (auto st = store_->AppendEvent(hello.job_id(), e, clock_->UnixMs()); st.ok()) {
      hub_.Publish(hello.job_id());
    } else {
      // The worker goes on (its metrics above still count); only this report is not kept.
      metrics_->StoreWriteFailed("event");
      if (!a->event_dropped) {
        FtdLog() << "CANNOT STORE the reports of job " << hello.job_id() << " (" << st
                 << "); dropping them until the store takes writes again";
      }
      a->event_dropped = true;
    }
  }
  return a->cancel || a->drain;
}

}  // namespace ftd::server
