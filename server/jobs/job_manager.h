// The job service's logic, without gRPC: it keeps the store, the in-memory queue and the running
// attempts in agreement. Each concern it uses is a piece of its own:
//   JobQueue (job_queue.h)             queued jobs in order, positions in O(log n)
//   Schedule (scheduling_policy.h)     which queued jobs start now, on which slot
//   Executor (executor.h)           where attempts run: start, stop, how they ended
//   Classify (exit_classification.h)   how an attempt ended -> reason, retry or final state
//   AppendStateEvents (job_events.h)   what a state change writes to the event log
//   EventHub (event_hub.h)             wakes a job's watchers on new events
//   Clock (clock.h)                    time, injected
// Every change of a job's record happens under mu_, in one store transaction with its events;
// reads (Get, List) take only view_mu_ for the queue positions.
// Nothing polls: the scheduling thread runs Tick() when woken (submit, a worker's exit, a freed
// slot) or at the next deadline it asked for (a retry's backoff, a heartbeat timeout). Tests inject
// the launcher and the clock and call Tick() themselves.
// Its definitions are split by concern, one file each:
//   job_manager.cc                 construction, the scheduling thread and Tick(), pause, drain,
//                                  TransitionLocked (the one way a job's record changes)
//   job_manager_recovery.cc        the restart policy and the queue rebuilt at start
//   job_manager_submit.cc          admission (Submit, validate_only) and Resubmit
//   job_manager_queue_view.cc      rooms and owners for the policy; Get/List annotations, placement
//   job_manager_attempts.cc        an attempt's start, launch, cancel and recorded outcome
//   job_manager_worker_reports.cc  the worker protocol: hello, assignment, reports
//   job_manager_outputs.cc         event watches, the job's log file, the trace
//   job_manager_removal.cc         Delete, Prune, retention
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "ftd/v1/jobs.pb.h"
#include "ftd/v1/worker.pb.h"
#include "server/common/clock.h"
#include "server/jobs/event_hub.h"
#include "server/policy/exit_classification.h"
#include "server/policy/job_queue.h"
#include "server/policy/memory_fit.h"
#include "server/jobs/metrics.h"
#include "server/policy/quotas.h"
#include "server/policy/scheduling_policy.h"
#include "server/store/store.h"
#include "server/policy/usage_ledger.h"
#include "server/executors/executor.h"
#include "spec/sandbox.h"

namespace ftd::server {

struct ManagerConfig {
  std::string data_dir;                 // jobs/<id>/{checkpoints,trace.json}
  int gpus = 0;                         // GPUs; 0: one CPU slot
  int gpu_compute_capability = 0;       // major * 10 + minor of the least capable GPU; 0: unknown
  // Jobs one GPU may hold at once (slots "gpu:N/k"; 1: slots "gpu:N"), packed while their predicted
  // peaks fit the GPU's memory (memory.gpu_bytes) less gpu_margin_bytes.
  int jobs_per_gpu = 1;
  int64_t gpu_margin_bytes = int64_t{2} << 30;
  QuotaConfig quotas;                   // per-user limits and fair share (quotas.h)
  int max_queued = 1000;                // RESOURCE_EXHAUSTED beyond
  int default_max_attempts = 3;
  int grace_ms = 10000;                 // SIGTERM -> SIGKILL on cancel
  int heartbeat_timeout_ms = 30000;     // no message from a worker for this long: lost
  // From the worker's start message on, no step and no load/checkpoint progress for this long:
  // stuck (NO_PROGRESS), killed. 0: no watchdog.
  int64_t progress_timeout_ms = 600000;
  int backoff_base_ms = 2000;           // retry n waits base * 2^(n-1), capped
  int backoff_max_ms = 60000;
  bool requeue_on_restart = true;       // policy for jobs found RUNNING at start (docs/api.md)
  bool paused = false;                  // at start: accept and store jobs, start none (maintenance)
  MachineMemory memory;                 // what a worker may use: the bound at submit (memory_fit.h)
  // Finished jobs older than this are deleted with their files (0: kept forever); checked every
  // retention_check_ms, which also removes leftover partial checkpoints (step-N.tmp) of jobs not running.
  int64_t retention_ms = 0;
  int64_t retention_check_ms = 3600'000;
  // The directories a job's paths may name (spec/sandbox.h); none configured: not confined.
  ftd::spec::SandboxConfig sandbox;
  // Who the workers run as: this uid (ftd's own, or --worker-user), or, for a job with an owner_uid,
  // that owner (--workers-as-owner). With no roots, a local user's job whose workers run as someone
  // else may name only paths its owner could use (spec::CheckUserMayUse).
  uid_t workers_uid = 0;
  bool workers_as_owner = false;
};

// What DeleteJob and PruneJobs removed.
struct Removed {
  std::vector<std::string> ids;
  int64_t freed_bytes = 0;
};

// Which finished jobs PruneJobs removes: all conditions hold.
struct PruneFilter {
  int64_t older_than_ms = 0;              // finished at least this long ago
  std::vector<ftd::v1::JobState> states;  // terminal states; empty: all three
  std::string owner;                      // empty: any
  bool dry_run = false;
};

class JobManager {
 public:
  // `store`, `metrics`, `launcher` and `clock` outlive the manager.
  JobManager(ManagerConfig cfg, Store* store, Metrics* metrics, Executor* launcher, const Clock* clock);
  ~JobManager();

  // Applies the restart policy to jobs a previous daemon left RUNNING and loads the queue from the
  // store. Start() does this, then starts the scheduling thread.
  absl::Status Recover();
  absl::Status Start();
  // One scheduling round: marks silent workers lost (and kills them), records outcomes that could not
  // be written before, starts what the policy says. Returns how long until it wants to run again
  // (nullopt: only when woken).
  std::optional<std::chrono::milliseconds> Tick();
  // Stops taking work, asks running workers to stop (they checkpoint), requeues their jobs, and
  // waits for them until `deadline`; kills what is left.
  void Drain(std::chrono::steady_clock::time_point deadline);

  // `submitted_by` / `cancelled_by`: the authenticated caller, recorded in the job. `owner_uid`: the
  // owner's local uid when the owner submits over the unix socket (Job.owner_uid).
  absl::StatusOr<ftd::v1::SubmitJobResponse> Submit(const ftd::v1::SubmitJobRequest& req,
                                                    const std::string& submitted_by = "",
                                                    std::optional<uint32_t> owner_uid = std::nullopt) {
    return SubmitWith(req, submitted_by, owner_uid, nullptr);
  }
  absl::StatusOr<ftd::v1::Job> Get(const std::string& id);
  absl::StatusOr<ftd::v1::ListJobsResponse> List(const ftd::v1::ListJobsRequest& req);
  // `checkpoint`: the worker writes a checkpoint before it stops (and is not killed while it reports
  // the write moving); otherwise it stops at its next step boundary without one.
  absl::StatusOr<ftd::v1::Job> Cancel(const std::string& id, const std::string& cancelled_by = "",
                                      bool checkpoint = false);
  // A finished job, its events and its directory (checkpoints, trace, log).
  absl::StatusOr<Removed> Delete(const std::string& id);
  absl::StatusOr<Removed> Prune(const PruneFilter& f);
  // Deletes what the retention outlived and partial checkpoints left behind; Tick() runs it every
  // retention_check_ms when retention_ms is set.
  absl::StatusOr<Removed> RunRetention();
  // A new job from an existing one's request (see ResubmitJobRequest in jobs.proto).
  absl::StatusOr<ftd::v1::SubmitJobResponse> Resubmit(const ftd::v1::ResubmitJobRequest& req,
                                                      const std::string& submitted_by = "",
                                                      std::optional<uint32_t> owner_uid = std::nullopt);
  // The scheduler: paused, no queued job starts; running jobs go on and submits are accepted.
  ftd::v1::SchedulerState SetPaused(bool paused);
  ftd::v1::SchedulerState Scheduler() const;

  // The job's log: the worker's output and the daemon's step lines.
  struct LogFile {
    std::string path;
    bool ended = false;  // the job is finished: the file grows no more
  };
  absl::StatusOr<LogFile> Log(const std::string& id);
  // Wakes on each new event of the job (a log follower's cue that the log may have grown too).
  std::unique_ptr<EventHub::Subscription> Subscribe(const std::string& id) { return hub_.Subscribe(id); }

  // One client's watch of a job's event log.
  class Watch {
   public:
    // Events after the last one returned (or after `after_seq`), waiting up to `max_wait` for some
    // when there are none. *done is set once the job is terminal and every event has been returned.
    absl::StatusOr<std::vector<ftd::v1::JobEvent>> Next(std::chrono::milliseconds max_wait, bool* done);

   private:
    friend class JobManager;
    Watch(JobManager* m, std::string id, int64_t after_seq);
    JobManager* m_;
    std::string id_;
    int64_t after_;
    std::unique_ptr<EventHub::Subscription> sub_;
    bool reread_ = true;  // the log may hold events not yet returned
  };
  absl::StatusOr<std::unique_ptr<Watch>> WatchJob(const std::string& id, int64_t after_seq);
  // Ends every wait of every watch (the daemon is stopping).
  void CloseWatches() { hub_.Shutdown(); }

  // A PROFILE job's Chrome trace file, once written (NOT_FOUND before; FAILED_PRECONDITION for other kinds).
  absl::StatusOr<std::string> TracePath(const std::string& id);

  // Worker protocol.
  absl::StatusOr<ftd::v1::Assignment> Assign(const ftd::v1::WorkerHello& hello);
  // Returns whether the worker should stop.
  absl::StatusOr<bool> OnWorkerMessage(const ftd::v1::WorkerMessage& msg);

  int slots() const { return static_cast<int>(slots_.size()); }

  // A user's usage and limits as the scheduler sees them now (ftctl admin usage).
  struct UserUsage {
    std::string user;
    double window_gpu_hours = 0;   // in the last quotas.window_ms
    double decayed_gpu_hours = 0;  // fair share's weight
    int64_t queued = 0, running = 0;
    UserLimits limits;
  };
  std::vector<UserUsage> Usage(const std::string& user = "");

 private:
  // A started attempt, from the moment its slot is taken until its outcome is recorded.
  struct Attempt {
    std::string job_id, token, slot, owner;
    int gpu = -1;                 // CUDA index; -1: the CPU
    double gpus = 1;              // GPUs it counts for in usage (a share when it shares one)
    int64_t ended_ms = 0;         // unix ms its end was first seen (0: running)
    std::vector<std::string> more_slots;  // a job on several GPUs: the others it holds
    ftd::spec::KernelSet kernel_set = ftd::spec::KernelSet::kEager;
    int attempt = 0;
    int64_t pid = 0;              // 0 while the launcher is starting it
    int64_t started_ms = 0;       // unix ms
    int64_t last_seen_ms = 0;     // steady ms of the last message (or of the launch)
    bool cancel = false, drain = false, lost = false;
    bool watched = false;         // the progress watchdog runs (from the worker's start message)
    int64_t last_progress_ms = 0; // steady ms of the last step or progress report (or of the start)
    std::string last_progress = "started";  // what it was
    bool stuck = false;           // the watchdog killed it
    bool checkpoint_on_stop = false;  // a cancel asked for a checkpoint (a drain always does)
    int64_t progress_ms = 0;          // steady ms of the last moving checkpoint write while stopping
    std::optional<ftd::v1::RunResult> result;
    StepTotals totals;            // what its reports added to the metrics so far
    std::optional<WorkerEnd> unrecorded;  // ended, but the outcome is not in the store yet
    int unrecorded_tries = 0;     // failed writes of that outcome
    bool event_dropped = false;   // a report of it could not be stored
    bool write_noted = false;     // the current checkpoint write's predicted end was logged
  };

  // Submit; `prepare` runs under mu_ once the job is stored and before it can start (a resumed job's
  // checkpoint is moved into place there); its error fails the new job.
  absl::StatusOr<ftd::v1::SubmitJobResponse> SubmitWith(const ftd::v1::SubmitJobRequest& req,
                                                        const std::string& submitted_by,
                                                        std::optional<uint32_t> owner_uid,
                                                        const std::function<absl::Status(const ftd::v1::Job&)>& prepare);
  absl::StatusOr<int64_t> DeleteLocked(const std::string& id);
  void AppendToLog(const std::string& id, const std::string& line) const;
  absl::StatusOr<ftd::v1::Job> TransitionLocked(const std::string& id,
                                                const std::function<absl::Status(ftd::v1::Job&)>& change);
  absl::StatusOr<LaunchRequest> StartLocked(const Placement& p);
  void Launched(const LaunchRequest& req, const absl::StatusOr<int64_t>& pid);
  void LaunchedLocked(const LaunchRequest& req, const absl::StatusOr<int64_t>& pid, bool* kick);
  void OnWorkerExit(const std::string& job_id, int attempt, ExitStatus st);
  // Records the attempt's outcome; on success removes it and frees its slot.
  bool FinishLocked(Attempt& a, const WorkerEnd& end);
  // Applies the restart policy to a job a previous daemon left RUNNING (its worker killed).
  absl::Status RecoverRunningLocked(const ftd::v1::Job& j);
  static StopMode StopModeLocked(const Attempt& a);
  // The attempt a worker's hello names, marked as heard from now; PERMISSION_DENIED if it is not
  // the one running (an old attempt, a wrong token, or one whose end is being recorded).
  absl::StatusOr<Attempt*> HeardFromLocked(const ftd::v1::WorkerHello& hello);
  // What annotating queued jobs needs, computed once per call (O(queue log queue)).
  struct QueueView {
    std::map<std::string, OwnerState> owners;
    std::unordered_map<std::string, QueueSpot> spots;
  };
  QueueView QueueViewLocked() const;
  void AnnotateLocked(ftd::v1::Job* job, const QueueView& view) const;
  std::vector<GpuRoom> RoomsLocked() const;
  // Owners of queued jobs: their usage, running jobs and limits (the hold reason when one is spent).
  std::map<std::string, OwnerState> OwnersLocked(int64_t now_ms) const;
  void PublishGaugesLocked();
  void PublishGpusLocked();
  // Where the job would run now, or why it would wait (validate_only).
  // What usage is counted in, for messages: "GPU-hours", or "CPU-slot hours" on a daemon without GPUs.
  const char* UsageUnit() const { return cfg_.gpus > 0 ? "GPU-hours" : "CPU-slot hours"; }
  std::string PlacementLocked(const ftd::v1::Job& job) const;
  void Kick();
  void Loop();
  std::string JobDir(const std::string& id) const;
  // 128 random bits in hex: an attempt's token, a staging directory's name.
  static std::string NewToken();

  const ManagerConfig cfg_;
  Store* const store_;
  Metrics* const metrics_;
  Executor* const launcher_;
  const Clock* const clock_;
  std::vector<std::string> slots_;
  std::vector<int> slot_gpu_;  // each slot's GPU (-1: the CPU)
  EventHub hub_;

  mutable std::mutex mu_;
  std::condition_variable exits_cv_;          // an attempt was removed (Drain waits on it)
  std::map<std::string, Attempt> running_;    // by job id
  // What Get and List read to annotate jobs: changed under mu_ and view_mu_ together, read under
  // either, so a read never waits behind a commit that holds mu_.
  mutable std::mutex view_mu_;
  JobQueue queue_;
  struct SlotUse {
    std::string job_id, owner;
    int64_t gpu_bytes = -1;  // QueuedJob::gpu_bytes of the job on it
    bool primary = true;     // false: one of the other GPUs of a job on several
    bool whole = false;      // a job on several GPUs: no other job joins it on this GPU
  };
  std::map<std::string, SlotUse> slot_use_;  // busy slots
  UsageLedger usage_;                        // GPU time by owner (quotas, fair share)
  std::string waits_for_memory_;             // the job the last round left waiting for GPU memory
  std::string waits_for_gpus_;               // the job on several GPUs it left waiting for whole GPUs
  std::map<std::string, ftd::v1::JobPhase> phases_;  // job id -> the long phase its worker is in (Job.phase)
  std::map<ftd::v1::JobState, int64_t> counts_;    // jobs in the store by state (the ftd_jobs gauge)
  bool draining_ = false;
  std::atomic<bool> paused_{false};
  int64_t next_retention_ms_ = 0;  // steady ms of the next retention run
  int64_t unrecorded_ = 0;  // attempts whose outcome waits in memory (the ftd_unrecorded_outcomes gauge)
  std::vector<ftd::v1::Job> unrecovered_;  // left RUNNING by a previous daemon; the restart not yet written
  std::map<std::string, int> short_starts_;  // job id -> launches in a row ftd was too short of resources for

  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool kicked_ = false, stopping_ = false;
  std::thread loop_;
};

}  // namespace ftd::server
