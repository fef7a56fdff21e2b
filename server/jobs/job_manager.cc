// JobManager's frame: construction, the scheduling thread and its round (Tick: heartbeats and the
// progress watchdog, outcomes waiting for the store, the policy's starts, retention), pausing,
// draining at shutdown, and the one way a job's record changes (TransitionLocked: the store update
// with its state events, the state gauge and the watchers' wake-up). What each round and each call
// does beyond that lives in the job_manager_*.cc file named for it (see job_manager.h).
#include "server/jobs/job_manager.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/strings/str_cat.h"
#include "server/jobs/job_events.h"
#include "server/common/log.h"
#include "server/policy/scheduling_policy.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

JobManager::JobManager(ManagerConfig cfg, Store* store, Metrics* metrics, Executor* launcher,
                       const Clock* clock)
    : cfg_(std::move(cfg)), store_(store), metrics_(metrics), launcher_(launcher), clock_(clock), paused_(cfg_.paused) {
  if (cfg_.gpus > 0) {
    for (int i = 0; i < cfg_.gpus; ++i) {
      for (int k = 0; k < std::max(cfg_.jobs_per_gpu, 1); ++k) {
        slots_.push_back(cfg_.jobs_per_gpu > 1 ? absl::StrCat("gpu:", i, "/", k) : absl::StrCat("gpu:", i));
        slot_gpu_.push_back(i);
      }
    }
  } else {
    slots_.push_back(kCpuSlot);
    slot_gpu_.push_back(-1);
  }
  launcher_->SetExitHandler(
      [this](const std::string& job_id, int attempt, ExitStatus st) { OnWorkerExit(job_id, attempt, st); });
}

JobManager::~JobManager() {
  {
    std::lock_guard<std::mutex> l(loop_mu_);
    stopping_ = true;
  }
  loop_cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  launcher_->SetExitHandler(nullptr);
  hub_.Shutdown();
}

absl::Status JobManager::Start() {
  if (auto st = Recover(); !st.ok()) return st;
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void JobManager::Kick() {
  {
    std::lock_guard<std::mutex> l(loop_mu_);
    kicked_ = true;
  }
  loop_cv_.notify_one();
}

void JobManager::Loop() {
  std::unique_lock<std::mutex> l(loop_mu_);
  while (!stopping_) {
    kicked_ = false;
    l.unlock();
    const auto wait = Tick();
    l.lock();
    const auto woken = [&] { return kicked_ || stopping_; };
    if (wait.has_value()) {
      loop_cv_.wait_for(l, *wait, woken);
    } else {
      loop_cv_.wait(l, woken);
    }
  }
}

std::optional<std::chrono::milliseconds> JobManager::Tick() {
  std::vector<LaunchRequest> launches;
  std::optional<int64_t> wait_ms;
  auto wake_in = [&](int64_t ms) { wait_ms = std::min(wait_ms.value_or(ms), std::max<int64_t>(ms, 0)); };
  {
    std::lock_guard<std::mutex> l(mu_);
    const int64_t steady = clock_->SteadyMs();
    std::vector<std::string> unrecorded;
    for (auto& [id, a] : running_) {
      if (a.unrecorded.has_value()) {
        unrecorded.push_back(id);
      } else if (a.pid > 0 && !a.lost && !a.stuck) {
        const int64_t silent = steady - a.last_seen_ms;
        if (silent >= cfg_.heartbeat_timeout_ms) {
          a.lost = true;
          launcher_->Kill(a.pid);
          continue;
        }
        wake_in(cfg_.heartbeat_timeout_ms - silent);
        if (!a.watched || cfg_.progress_timeout_ms <= 0) continue;
        const int64_t idle = steady - a.last_progress_ms;
        if (idle >= cfg_.progress_timeout_ms) {
          a.stuck = true;
          FtdLog() << "job " << id << " attempt " << a.attempt << " is stuck (no progress for " << idle / 1000.0
                   << " s; last: " << a.last_progress << "); killing its worker " << a.pid;
          launcher_->Kill(a.pid);
        } else {
          wake_in(cfg_.progress_timeout_ms - idle);
        }
      }
    }
    for (const auto& id : unrecorded) {
      Attempt& a = running_.at(id);
      if (!FinishLocked(a, *a.unrecorded)) wake_in(1000);
    }
    for (auto it = unrecovered_.begin(); it != unrecovered_.end();) {
      if (RecoverRunningLocked(*it).ok()) {
        FtdLog() << "recorded the restart of job " << it->id() << " after a failed write";
        metrics_->UnrecordedOutcomes(--unrecorded_);
        it = unrecovered_.erase(it);
      } else {
        wake_in(1000);
        ++it;
      }
    }
    if (!paused_ && !draining_) {
      const int64_t now = clock_->UnixMs();
      const auto owners = OwnersLocked(now);
      SchedulingInput in{&queue_, RoomsLocked(), now, cfg_.gpu_margin_bytes, &owners};
      const SchedulingPlan plan = Schedule(in);
      {
        std::lock_guard<std::mutex> view(view_mu_);
        waits_for_memory_ = plan.waits_for_memory;
        waits_for_gpus_ = plan.waits_for_gpus;
      }
      // An owner held by the GPU-hours quota is looked at again in a minute: usage leaves the window.
      for (const auto& [name, o] : owners) {
        if (!o.held.empty()) wake_in(60'000);
      }
      for (const Placement& p : plan.starts) {
        auto req = StartLocked(p);
        if (req.ok()) {
          launches.push_back(*std::move(req));
        } else {
          FtdLog() << "cannot start job " << p.job_id << ": " << req.status() << "; trying again in 1 s";
          metrics_->StoreWriteFailed("state");
          wake_in(1000);
        }
      }
      if (plan.recheck_at_ms.has_value()) wake_in(*plan.recheck_at_ms - now);
    }
  }
  for (const LaunchRequest& req : launches) Launched(req, launcher_->Launch(req));
  // A worker started now is watched from here on: its heartbeat's deadline (and, once it says it
  // started, the progress watchdog's) comes at the latest then, with nothing else waking the loop.
  if (!launches.empty()) wake_in(cfg_.heartbeat_timeout_ms);
  if (cfg_.retention_ms > 0) {
    const int64_t steady = clock_->SteadyMs();
    if (steady >= next_retention_ms_) {
      next_retention_ms_ = steady + cfg_.retention_check_ms;
      auto removed = RunRetention();
      if (!removed.ok()) FtdLog() << "retention: " << removed.status();
    }
    wake_in(next_retention_ms_ - steady);
  }
  if (!wait_ms.has_value()) return std::nullopt;
  return std::chrono::milliseconds(*wait_ms);
}

void JobManager::Drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> l(mu_);
  draining_ = true;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  for (auto& [id, a] : running_) {
    a.drain = true;
    if (a.pid > 0) launcher_->Stop(a.pid, std::max(left, std::chrono::milliseconds(0)), StopMode::kCheckpoint);
  }
  // A worker still writing its checkpoint at the deadline (it reported the write moving within the
  // last grace period) is waited for; one that shows no progress is killed.
  for (;;) {
    exits_cv_.wait_until(l, deadline, [&] { return running_.empty(); });
    const int64_t now = clock_->SteadyMs();
    bool moving = false;
    for (const auto& [id, a] : running_) moving |= a.progress_ms > 0 && now - a.progress_ms < cfg_.grace_ms;
    if (!moving || running_.empty()) break;
    deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg_.grace_ms);
  }
  for (auto& [id, a] : running_) {
    if (a.pid > 0) launcher_->Kill(a.pid);
  }
  exits_cv_.wait_for(l, std::chrono::seconds(2), [&] { return running_.empty(); });
}

ftd::v1::SchedulerState JobManager::SetPaused(bool paused) {
  const bool was = paused_.exchange(paused);
  if (was != paused) {
    FtdLog() << "scheduler " << (paused ? "paused: no queued job starts" : "resumed");
  }
  if (!paused) Kick();
  return Scheduler();
}

ftd::v1::SchedulerState JobManager::Scheduler() const {
  ftd::v1::SchedulerState st;
  st.set_paused(paused_);
  std::lock_guard<std::mutex> view(view_mu_);
  st.set_slots(static_cast<int32_t>(slots_.size()));
  st.set_busy(static_cast<int32_t>(slot_use_.size()));
  st.set_queued(static_cast<int64_t>(queue_.size()));
  return st;
}

absl::StatusOr<Job> JobManager::TransitionLocked(const std::string& id,
                                                 const std::function<absl::Status(Job&)>& change) {
  ftd::v1::JobState before = ftd::v1::JOB_STATE_UNSPECIFIED;
  auto job = store_->Update(
      id,
      [&](Job& job, std::vector<JobEvent>& events) {
        before = job.state();
        if (auto st = change(job); !st.ok()) return st;
        AppendStateEvents(job, &events);
        return absl::OkStatus();
      },
      clock_->UnixMs());
  if (!job.ok()) return job;
  if (before != job->state()) {
    --counts_[before];
    ++counts_[job->state()];
    PublishGaugesLocked();
    FtdLog() << "job " << id << " " << ftd::v1::JobState_Name(before) << " -> "
             << ftd::v1::JobState_Name(job->state()) << " (" << job->reason() << "): " << job->message();
  }
  hub_.Publish(id);
  return job;
}

void JobManager::PublishGaugesLocked() { metrics_->JobsByState(counts_); }

std::string JobManager::JobDir(const std::string& id) const {
  return (fs::path(cfg_.data_dir) / "jobs" / id).string();
}

std::string JobManager::NewToken() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

}  // namespace ftd::server
