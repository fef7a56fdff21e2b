#include "server/job_manager.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/job_events.h"
#include "server/job_files.h"
#include "server/memory_fit.h"
#include "server/request_limits.h"
#include "server/request_match.h"
#include "server/scheduling_policy.h"
#include "spec/input_files.h"
#include "spec/peak_memory.h"
#include "spec/message_check.h"
#include "spec/spec.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

namespace {

std::string RandomToken() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

constexpr ftd::v1::JobState kStates[] = {ftd::v1::QUEUED, ftd::v1::RUNNING, ftd::v1::SUCCEEDED, ftd::v1::FAILED,
                                         ftd::v1::CANCELLED};

}  // namespace

JobManager::JobManager(ManagerConfig cfg, Store* store, Metrics* metrics, WorkerLauncher* launcher,
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
    slots_.push_back("cpu");
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

// ---------------------------------------------------------------------------------------------
// Start, the scheduling thread, drain

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
      std::cerr << "ftd: CANNOT RECORD that job " << j.id() << " was running when ftd restarted: " << st
                << "; starting anyway, keeping it in memory and trying again every second" << std::endl;
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
          std::cerr << "ftd: job " << id << " attempt " << a.attempt << " is stuck (no progress for " << idle / 1000.0
                    << " s; last: " << a.last_progress << "); killing its worker " << a.pid << std::endl;
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
        std::cerr << "ftd: recorded the restart of job " << it->id() << " after a failed write" << std::endl;
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
          std::cerr << "ftd: cannot start job " << p.job_id << ": " << req.status() << "; trying again in 1 s"
                    << std::endl;
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
      if (!removed.ok()) std::cerr << "ftd: retention: " << removed.status() << std::endl;
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

// ---------------------------------------------------------------------------------------------
// Job records

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
    std::cerr << "ftd: job " << id << " " << ftd::v1::JobState_Name(before) << " -> "
              << ftd::v1::JobState_Name(job->state()) << " (" << job->reason() << "): " << job->message() << std::endl;
  }
  hub_.Publish(id);
  return job;
}

void JobManager::PublishGaugesLocked() { metrics_->JobsByState(counts_); }

std::string JobManager::JobDir(const std::string& id) const {
  return (fs::path(cfg_.data_dir) / "jobs" / id).string();
}

std::vector<GpuRoom> JobManager::RoomsLocked() const {
  std::vector<GpuRoom> rooms;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (rooms.empty() || rooms.back().gpu != slot_gpu_[i]) {
      rooms.push_back({});
      rooms.back().gpu = slot_gpu_[i];
      rooms.back().capacity_bytes = slot_gpu_[i] >= 0 ? cfg_.memory.gpu_bytes : 0;
    }
    GpuRoom& r = rooms.back();
    auto it = slot_use_.find(slots_[i]);
    if (it == slot_use_.end()) {
      r.free_slots.push_back(slots_[i]);
      continue;
    }
    ++r.jobs;
    if (it->second.whole) r.exclusive = true;
    if (it->second.gpu_bytes < 0) {
      r.exclusive = true;
    } else {
      r.used_bytes += it->second.gpu_bytes;
    }
  }
  return rooms;
}

std::map<std::string, OwnerState> JobManager::OwnersLocked(int64_t now_ms) const {
  std::map<std::string, OwnerState> owners;
  const QuotaConfig& q = cfg_.quotas;
  queue_.ForEach([&](const QueuedJob& j) {
    owners.try_emplace(j.owner);
    return true;
  });
  for (const auto& [slot, use] : slot_use_) {
    if (!use.primary) continue;  // a job's other GPUs
    if (auto it = owners.find(use.owner); it != owners.end()) ++it->second.running;
  }
  for (auto& [name, o] : owners) {
    if (q.half_life_ms > 0) o.usage = usage_.Decayed(name, now_ms, q.half_life_ms);
    const UserLimits& l = q.For(name);
    o.max_running = static_cast<int>(l.max_running);
    if (l.gpu_hours > 0) {
      const double used = usage_.GpuHours(name, now_ms - q.window_ms, now_ms);
      if (used >= l.gpu_hours) {
        o.held = absl::StrFormat("user %s has used %.1f GPU-hours in the last %s, the limit for the user "
                                 "(gpu-hours=%g): the user's jobs start once older use leaves the window",
                                 name, used, HoursText(q.window_ms), l.gpu_hours);
      }
    }
  }
  return owners;
}

void JobManager::PublishGpusLocked() {
  if (cfg_.gpus <= 0) return;
  std::map<int, std::pair<int, int64_t>> gpus;  // gpu -> (jobs, predicted bytes)
  for (int g = 0; g < cfg_.gpus; ++g) gpus[g] = {0, 0};
  for (size_t i = 0; i < slots_.size(); ++i) {
    auto it = slot_use_.find(slots_[i]);
    if (it == slot_use_.end() || slot_gpu_[i] < 0) continue;
    auto& [jobs, bytes] = gpus[slot_gpu_[i]];
    ++jobs;
    bytes += std::max<int64_t>(it->second.gpu_bytes, 0);
  }
  for (const auto& [g, v] : gpus) metrics_->GpuShare(g, v.first, v.second);
}

// ---------------------------------------------------------------------------------------------
// Client API

absl::StatusOr<ftd::v1::SubmitJobResponse> JobManager::SubmitWith(
    const ftd::v1::SubmitJobRequest& in, const std::string& submitted_by,
    const std::function<absl::Status(const Job&)>& prepare) {
  ftd::v1::SubmitJobRequest req = in;  // its spec's paths are confined to the owner's roots below
  {
    std::lock_guard<std::mutex> l(mu_);
    if (draining_) return absl::UnavailableError("ftd is shutting down; submit again once it is back");
  }
  if (auto st = CheckRequestStrings(req); !st.ok()) return st;
  if (req.request_id().size() > 128) return absl::InvalidArgumentError("request_id must be at most 128 characters");
  if (req.priority() < -1000 || req.priority() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("priority must be in [-1000, 1000] (got ", req.priority(), ")"));
  }
  if (req.has_max_attempts() && (req.max_attempts() < 1 || req.max_attempts() > 20)) {
    return absl::InvalidArgumentError(absl::StrCat("max_attempts must be in [1, 20] (got ", req.max_attempts(),
                                                   "); leave it unset for ftd's default (",
                                                   cfg_.default_max_attempts, ")"));
  }
  // The request as a whole (an unknown kind, stray fields), then the spec against this daemon.
  if (auto st = ftd::spec::CheckMessage(req, ""); !st.ok()) return st;
  if (cfg_.sandbox.enabled()) {
    auto roots = cfg_.sandbox.RootsFor(req.owner());
    if (!roots.ok()) return roots.status();
    if (auto st = ftd::spec::ConfineSpecPaths(*roots, req.mutable_spec()); !st.ok()) return st;
  }
  ftd::spec::Environment env;
  env.name = "this ftd";
  env.gpus = cfg_.gpus > 0 ? 1 : 0;  // a job gets one GPU, which it sees as cuda:0
  env.gpu_compute_capability = cfg_.gpu_compute_capability;
  env.host_gpus = cfg_.gpus;          // or spec.gpus of them, all of one host
  auto config = ftd::spec::Validate(req.spec(), env);
  if (!config.ok()) return config.status();
  if (auto st = ftd::spec::CheckInputFiles(*config); !st.ok()) return st;
  const bool gpu = cfg_.gpus > 0 && config->device != "cpu";
  int64_t predicted = 0;
  if (auto model = ModelShape(*config, gpu); model.has_value()) {
    if (auto st = CheckMemoryFit(*model, *config, gpu, cfg_.memory); !st.ok()) return st;
    predicted = static_cast<int64_t>(ftd::spec::PredictPeakMemory(*model, *config, gpu).Peak());
  }
  const std::string owner = req.owner().empty() ? "unknown" : req.owner();
  const UserLimits& limits = cfg_.quotas.For(owner);
  if (limits.gpu_hours > 0) {
    std::lock_guard<std::mutex> l(mu_);
    const int64_t now = clock_->UnixMs();
    const double used = usage_.GpuHours(owner, now - cfg_.quotas.window_ms, now);
    if (used >= limits.gpu_hours) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "user %s has used %.1f GPU-hours in the last %s, the limit for the user (gpu-hours=%g); submit again "
          "once older use has left the window, or ask an admin to raise the limit",
          owner, used, HoursText(cfg_.quotas.window_ms), limits.gpu_hours));
    }
  }
  Job job;
  job.set_name(req.name());
  job.set_kind(req.kind() == ftd::v1::JOB_KIND_UNSPECIFIED ? ftd::v1::FINETUNE : req.kind());
  job.set_owner(owner);
  job.set_submitted_by(submitted_by);
  job.set_priority(req.priority());
  job.set_state(ftd::v1::QUEUED);
  job.set_reason("WAITING_FOR_SLOT");
  job.set_max_attempts(req.has_max_attempts() ? req.max_attempts() : cfg_.default_max_attempts);
  job.set_request_id(req.request_id());
  *job.mutable_spec() = req.spec();
  job.set_predicted_peak_bytes(predicted);
  ftd::v1::SubmitJobResponse resp;
  if (req.validate_only()) {
    std::lock_guard<std::mutex> l(mu_);
    resp.set_predicted_peak_bytes(predicted);
    resp.set_placement(PlacementLocked(job));
    *resp.mutable_job() = std::move(job);
    return resp;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    // The queue limits are checked in the insert's transaction.
    auto inserted = store_->Insert(job, clock_->UnixMs(), cfg_.max_queued, limits.max_queued);
    if (!inserted.ok()) {
      const auto& st = inserted.status();
      if (absl::StrContains(st.message(), "the disk is full") || absl::IsInternal(st) || absl::IsDataLoss(st)) {
        metrics_->StoreWriteFailed("submit");
      }
      return st;
    }
    if (!inserted->second) {
      if (auto st = CheckSameRequest(inserted->first, job); !st.ok()) return st;
    }
    if (inserted->second) {
      ++counts_[ftd::v1::QUEUED];
      metrics_->JobSubmitted(inserted->first.kind());
      const Job& j = inserted->first;
      std::cerr << "ftd: job " << j.id() << " submitted: " << ftd::v1::JobKind_Name(j.kind()) << " \"" << j.name()
                << "\" by " << j.owner() << ", priority " << j.priority() << ", " << j.max_attempts() << " attempt(s)"
                << std::endl;
      if (prepare) {
        if (auto st = prepare(j); !st.ok()) {
          auto failed = TransitionLocked(j.id(), [&](Job& job) {
            job.set_state(ftd::v1::FAILED);
            job.set_reason(std::string(Info(Reason::kInvalidSpec).code));
            job.set_message(std::string(st.message()));
            job.set_finished_unix_ms(clock_->UnixMs());
            job.mutable_result()->set_outcome(RunResult::FAILED);
            job.mutable_result()->set_message(job.message());
            return absl::OkStatus();
          });
          if (!failed.ok()) return failed.status();
          return st;
        }
      }
      std::lock_guard<std::mutex> view(view_mu_);
      queue_.Put(j);
      PublishGaugesLocked();
      hub_.Publish(j.id());
    }
    *resp.mutable_job() = inserted->first;
    resp.set_created(inserted->second);
    resp.set_predicted_peak_bytes(resp.job().predicted_peak_bytes());
    std::lock_guard<std::mutex> view(view_mu_);
    AnnotateLocked(resp.mutable_job(), resp.job().state() == ftd::v1::QUEUED ? QueueViewLocked() : QueueView{});
  }
  if (resp.created()) Kick();
  return resp;
}

// Fills in what only the running daemon knows: the queue position and why a queued job waits.
// Needs view_mu_ only: a read does not wait for a commit another call holds mu_ across.
JobManager::QueueView JobManager::QueueViewLocked() const {
  QueueView v;
  if (queue_.size() == 0) return v;
  v.owners = OwnersLocked(clock_->UnixMs());
  v.spots = QueueSpots(queue_, &v.owners);
  return v;
}

namespace {

std::string GiB(int64_t b) { return absl::StrFormat("%.1f GiB", static_cast<double>(b) / (int64_t{1} << 30)); }

}  // namespace

void JobManager::AnnotateLocked(Job* job, const QueueView& view) const {
  job->set_queue_position(0);
  if (auto it = phases_.find(job->id()); it != phases_.end() && job->state() == ftd::v1::RUNNING) {
    *job->mutable_phase() = it->second;
  }
  if (job->state() != ftd::v1::QUEUED) return;
  auto spot_it = view.spots.find(job->id());
  const QueueSpot spot = spot_it != view.spots.end() ? spot_it->second : QueueSpot{queue_.Position(job->id()), 0, 0};
  job->set_queue_position(spot.position);
  const int64_t now = clock_->UnixMs();
  if (job->not_before_unix_ms() > now) {
    job->set_message(absl::StrCat(job->message(), absl::StrFormat(" (retry in %.1fs)",
                                                                  (job->not_before_unix_ms() - now) / 1000.0)));
    return;
  }
  const QuotaConfig& q = cfg_.quotas;
  auto owner_it = view.owners.find(job->owner());
  const OwnerState owner = owner_it != view.owners.end() ? owner_it->second : OwnerState{};
  std::string reason = "WAITING_FOR_SLOT", why;
  if (paused_) {
    reason = "PAUSED";
    why = "the scheduler is paused (ftctl resume starts it): no job starts; ";
  } else if (!owner.held.empty()) {
    reason = "QUOTA";
    why = owner.held + "; ";
  } else if (owner.max_running > 0 && owner.running >= owner.max_running) {
    reason = "QUOTA";
    why = absl::StrCat("user ", job->owner(), " runs ", owner.running, " job(s), the limit for the user (running=",
                       owner.max_running, "); ");
  } else if (waits_for_gpus_ == job->id()) {
    reason = "WAITING_FOR_GPUS";
    why = absl::StrCat("waits for ", SlotsNeeded(job->spec()), " free GPUs at once (spec.gpus; ",
                       WholeFreeGpus(RoomsLocked()).size(), " with no job on them now); ");
  } else if (waits_for_memory_ == job->id()) {
    reason = "WAITING_FOR_MEMORY";
    int64_t most = 0;
    for (const GpuRoom& r : RoomsLocked()) {
      if (!r.free_slots.empty() && !r.exclusive) {
        most = std::max(most, r.jobs == 0 ? r.capacity_bytes : r.capacity_bytes - r.used_bytes - cfg_.gpu_margin_bytes);
      }
    }
    why = absl::StrCat("it fits on no GPU now: predicted peak ",
                       job->predicted_peak_bytes() > 0 ? GiB(job->predicted_peak_bytes()) : "unknown (a GPU of its own)",
                       ", the most free on a GPU with a free slot ", GiB(std::max<int64_t>(most, 0)), " (less a margin of ",
                       GiB(cfg_.gpu_margin_bytes), " when shared); ");
  }
  std::string ahead = absl::StrCat(std::max<int64_t>(spot.position - 1, 0), " job(s) ahead in the queue");
  if (q.half_life_ms > 0 && spot.position > 1) {
    absl::StrAppend(&ahead, " (", spot.ahead_higher_priority, " of higher priority, ", spot.ahead_lower_usage,
                    " of users with lower recent GPU usage)");
  }
  std::string usage;
  if (q.half_life_ms > 0 || q.For(job->owner()).gpu_hours > 0) {
    usage = absl::StrFormat("; user %s has %.1f GPU-hours in the last %s", job->owner(),
                            usage_.GpuHours(job->owner(), now - q.window_ms, now), HoursText(q.window_ms));
    if (q.half_life_ms > 0) {
      absl::StrAppendFormat(&usage, " (fair-share usage %.2f, half-life %s)", owner.usage, HoursText(q.half_life_ms));
    }
  }
  job->set_reason(reason);
  job->set_message(absl::StrCat(why, ahead, usage, "; ", slot_use_.size(), " of ", slots_.size(), " slot(s) busy"));
}

std::string JobManager::PlacementLocked(const Job& job) const {
  QueuedJob probe;
  probe.owner = job.owner();
  probe.gpu_bytes = job.spec().device() == "cpu" ? 0 : job.predicted_peak_bytes() > 0 ? job.predicted_peak_bytes() : -1;
  const std::vector<GpuRoom> rooms = RoomsLocked();
  const int b = BestRoom(rooms, probe.gpu_bytes, cfg_.gpu_margin_bytes);
  const GpuRoom* best = b < 0 ? nullptr : &rooms[b];
  const std::string queued = queue_.size() > 0 ? absl::StrCat(" once the ", queue_.size(), " queued job(s) ahead of it have had their turn") : "";
  if (const int need = SlotsNeeded(job.spec()); need > 1) {
    const auto whole = WholeFreeGpus(rooms);
    if (whole.size() < static_cast<size_t>(need)) {
      return absl::StrCat("it would wait for ", need, " free GPUs at once (", whole.size(), " with no job on them now)",
                          queued.empty() ? "" : ", and" + queued);
    }
    std::vector<int> gpus;
    for (size_t k = 0; k < static_cast<size_t>(need); ++k) gpus.push_back(rooms[whole[k]].gpu);
    return absl::StrCat("it would start on GPUs ", absl::StrJoin(gpus, ","), queued.empty() ? " now" : queued);
  }
  if (best == nullptr) {
    return absl::StrCat("no slot fits it now: it would wait for a slot", probe.gpu_bytes > 0 ? " with enough GPU memory" : "",
                        queued.empty() ? "" : ", and" + queued);
  }
  std::string where = best->gpu < 0 ? std::string("the CPU slot") : absl::StrCat("GPU ", best->gpu);
  if (best->gpu >= 0 && best->capacity_bytes > 0) {
    absl::StrAppend(&where, " (", best->jobs, " job(s) on it, predicted ", GiB(best->used_bytes + std::max<int64_t>(probe.gpu_bytes, 0)),
                    " of ", GiB(best->capacity_bytes), " in use with this one)");
  }
  return absl::StrCat("it would start on ", where, queued.empty() ? " now" : queued);
}

absl::StatusOr<Job> JobManager::Get(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  std::lock_guard<std::mutex> view(view_mu_);
  AnnotateLocked(&*job, job->state() == ftd::v1::QUEUED ? QueueViewLocked() : QueueView{});
  return job;
}

absl::StatusOr<ftd::v1::ListJobsResponse> JobManager::List(const ftd::v1::ListJobsRequest& req) {
  JobFilter f;
  for (int s : req.states()) f.states.push_back(static_cast<ftd::v1::JobState>(s));
  f.owner = req.owner();
  f.kind = req.kind();
  f.newest_first = req.newest_first();
  if (req.page_size() < 0 || req.page_size() > 500) {
    return absl::InvalidArgumentError(absl::StrCat("page_size must be in [1, 500], or 0 for 50 (got ", req.page_size(), ")"));
  }
  f.limit = req.page_size() == 0 ? 50 : req.page_size();
  if (!req.page_token().empty()) {
    try {
      size_t used = 0;
      f.after_seq = std::stoll(req.page_token(), &used);
      if (used != req.page_token().size() || f.after_seq < 0) throw std::invalid_argument("token");
    } catch (const std::exception&) {
      return absl::InvalidArgumentError("page_token is not one this ftd issued; pass next_page_token unchanged");
    }
  }
  int64_t next = 0;
  auto jobs = store_->List(f, &next);
  if (!jobs.ok()) return jobs.status();
  ftd::v1::ListJobsResponse resp;
  std::lock_guard<std::mutex> view(view_mu_);
  const bool any_queued =
      std::any_of(jobs->begin(), jobs->end(), [](const Job& j) { return j.state() == ftd::v1::QUEUED; });
  const QueueView qv = any_queued ? QueueViewLocked() : QueueView{};
  for (auto& j : *jobs) {
    AnnotateLocked(&j, qv);
    *resp.add_jobs() = std::move(j);
  }
  if (next > 0) resp.set_next_page_token(absl::StrCat(next));
  return resp;
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
    std::cerr << "ftd: cannot record the cancel of job " << id << ": " << job.status()
              << "; the worker is being stopped anyway" << std::endl;
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

// ---------------------------------------------------------------------------------------------
// Deleting, pruning, retention, resubmitting, the scheduler, logs

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
    std::cerr << "ftd: job " << id << " deleted, but " << freed.status().message() << std::endl;
    return int64_t{0};
  }
  std::cerr << "ftd: job " << id << " deleted (" << ftd::v1::JobState_Name(job->state()) << ", " << *freed
            << " bytes of files)" << std::endl;
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
    out->freed_bytes += RemovePartialCheckpoints((it->path() / "checkpoints").string());
  }
  if (!out->ids.empty() || out->freed_bytes > 0) {
    std::cerr << "ftd: retention: deleted " << out->ids.size() << " job(s) finished over "
              << cfg_.retention_ms / 1000 << " s ago, freed " << out->freed_bytes << " bytes" << std::endl;
  }
  return out;
}

absl::StatusOr<ftd::v1::SubmitJobResponse> JobManager::Resubmit(const ftd::v1::ResubmitJobRequest& req,
                                                                const std::string& submitted_by) {
  auto old = store_->Get(req.id());
  if (!old.ok()) return old.status();
  ftd::v1::SubmitJobRequest sub;
  sub.set_kind(old->kind());
  sub.set_name(req.name().empty() ? old->name() : req.name());
  sub.set_priority(old->priority());
  sub.set_owner(old->owner());
  sub.set_max_attempts(old->max_attempts());
  sub.set_request_id(req.request_id());
  *sub.mutable_spec() = old->spec();
  for (const auto& kv : req.set()) {
    if (auto st = ftd::spec::ApplySetOverride(kv, sub.mutable_spec()); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("set \"", kv, "\": ", st.message()));
    }
  }
  if (!req.resume()) return Submit(sub, submitted_by);
  if (old->state() != ftd::v1::FAILED && old->state() != ftd::v1::CANCELLED) {
    return absl::FailedPreconditionError(absl::StrCat("job ", req.id(), " is ", ftd::v1::JobState_Name(old->state()),
                                                      "; only a FAILED or CANCELLED job can be resumed (resubmit "
                                                      "without --resume starts a new run)"));
  }
  const ftd::v1::CheckpointSpec& ck = old->spec().checkpoint();
  if (ck.has_enabled() && !ck.enabled()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", req.id(), " ran with checkpoint.enabled false: there is "
                                                      "nothing to resume from"));
  }
  sub.mutable_spec()->mutable_checkpoint()->set_resume(true);
  const std::string old_dir = ck.has_dir() ? ck.dir() : (fs::path(JobDir(req.id())) / "checkpoints").string();
  auto newest = NewestCheckpoint(old_dir);
  if (!newest.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", req.id(), " has no complete checkpoint in ", old_dir,
                                                      " (cancel --checkpoint writes one); resubmit without --resume "
                                                      "to start over"));
  }
  // A spec with a directory of its own resumes from it as it is. Otherwise the new job gets a copy
  // of the newest checkpoint (hard links), staged before the job exists and moved into its
  // directory before it can start.
  if (ck.has_dir()) return Submit(sub, submitted_by);
  const fs::path staging = fs::path(cfg_.data_dir) / "jobs" / absl::StrCat(".resume-", RandomToken());
  const fs::path staged = staging / fs::path(*newest).filename();
  if (auto st = LinkOrCopyTree(*newest, staged.string()); !st.ok()) {
    (void)RemoveTree(staging.string());
    return st;
  }
  auto resp = SubmitWith(sub, submitted_by, [&](const Job& job) -> absl::Status {
    std::error_code ec;
    fs::create_directories(JobDir(job.id()), ec);
    fs::rename(staging, fs::path(JobDir(job.id())) / "checkpoints", ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot move the checkpoint of ", req.id(), " into place for ", job.id(),
                                              ": ", ec.message()));
    }
    AppendToLog(job.id(), absl::StrCat("[ftd] resuming ", req.id(), " from ", *newest));
    return absl::OkStatus();
  });
  (void)RemoveTree(staging.string());  // gone after the move; left when the request id named an existing job
  return resp;
}

ftd::v1::SchedulerState JobManager::SetPaused(bool paused) {
  const bool was = paused_.exchange(paused);
  if (was != paused) {
    std::cerr << "ftd: scheduler " << (paused ? "paused: no queued job starts" : "resumed") << std::endl;
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

absl::StatusOr<JobManager::LogFile> JobManager::Log(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  return LogFile{(fs::path(JobDir(id)) / "worker.log").string(), IsTerminal(job->state())};
}

void JobManager::AppendToLog(const std::string& id, const std::string& line) const {
  std::error_code ec;
  fs::create_directories(JobDir(id), ec);
  // Never through a link: the job's directory may belong to the workers' user (--worker-user).
  const std::string path = (fs::path(JobDir(id)) / "worker.log").string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  const std::string text = line + '\n';
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
}

JobManager::Watch::Watch(JobManager* m, std::string id, int64_t after_seq)
    : m_(m), id_(std::move(id)), after_(after_seq), sub_(m->hub_.Subscribe(id_)) {}

absl::StatusOr<std::unique_ptr<JobManager::Watch>> JobManager::WatchJob(const std::string& id, int64_t after_seq) {
  if (after_seq < 0) return absl::InvalidArgumentError("after_seq must be >= 0");
  return std::unique_ptr<Watch>(new Watch(this, id, after_seq));
}

absl::StatusOr<std::vector<JobEvent>> JobManager::Watch::Next(std::chrono::milliseconds max_wait, bool* done) {
  constexpr int kLimit = kMaxEventsPerRead;
  const auto deadline = std::chrono::steady_clock::now() + max_wait;
  *done = false;
  for (;;) {
    if (reread_) {
      auto job = m_->store_->Get(id_);  // state first: every event of a terminal job is already stored
      if (!job.ok()) return job.status();
      auto events = m_->store_->Events(id_, after_, kLimit);
      if (!events.ok()) return events.status();
      *done = IsTerminal(job->state()) && events->size() < static_cast<size_t>(kLimit);
      if (!events->empty() || *done) {
        if (!events->empty()) after_ = events->back().seq();
        return events;
      }
      reread_ = false;
    }
    if (!sub_->WaitForNew(deadline)) return std::vector<JobEvent>();
    reread_ = true;
  }
}

absl::StatusOr<std::string> JobManager::TracePath(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  if (job->kind() != ftd::v1::PROFILE) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is a ", ftd::v1::JobKind_Name(job->kind()),
                                                      " job; only PROFILE jobs have a trace (ftctl submit --kind profile)"));
  }
  const std::string path = (fs::path(JobDir(id)) / "trace.json").string();
  std::error_code ec;
  if (!job->has_profile() || !fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("job ", id, " has no trace yet (", ftd::v1::JobState_Name(job->state()),
                                            "); it is written once the profiled steps ran"));
  }
  return path;
}

// ---------------------------------------------------------------------------------------------
// Attempts: start, worker messages, exit

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
  a.token = RandomToken();
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
  return LaunchRequest{job_id, a.attempt, a.token, slot, p.gpu, p.more_slots, p.more_gpus, std::max(1, job->spec().gpus())};
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
    std::cerr << "ftd: cannot record the worker pid of " << a.job_id << ": " << st.status() << std::endl;
  }
}

StopMode JobManager::StopModeLocked(const Attempt& a) {
  return a.drain || a.checkpoint_on_stop ? StopMode::kCheckpoint : StopMode::kNoCheckpoint;
}

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
        std::cerr << "ftd: CANNOT STORE the reports of job " << hello.job_id() << " (" << st
                  << "); dropping them until the store takes writes again" << std::endl;
      }
      a->event_dropped = true;
    }
  }
  return a->cancel || a->drain;
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
      std::cerr << "ftd: CANNOT RECORD the outcome of job " << a.job_id << " (" << info.code << ": " << v.message
                << "): " << job.status() << "; keeping it in memory and trying again every second" << std::endl;
    }
    const bool first = !a.unrecorded.has_value();
    a.unrecorded = end;
    if (first) metrics_->UnrecordedOutcomes(++unrecorded_);
    return false;
  }
  if (a.unrecorded.has_value()) {
    std::cerr << "ftd: recorded the outcome of job " << a.job_id << " (" << info.code << ") after "
              << a.unrecorded_tries << " failed write(s)" << std::endl;
    metrics_->UnrecordedOutcomes(--unrecorded_);
  }
  if (retried) metrics_->Retry(info.code);
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
      std::cerr << "ftd: cannot record the GPU usage of job " << a.job_id << ": " << st << std::endl;
    }
  }
  PublishGpusLocked();
  running_.erase(a.job_id);  // `a` is gone from here on
  exits_cv_.notify_all();
  return true;
}

}  // namespace ftd::server
