// How a job attempt ended, decided in one place. Two tables:
//
//  - kReasons: every reason code a finished attempt can leave on a job (Job.reason), the state it
//    gives the job when it is final, whether it is retried, and whether it means the service is
//    unwell. docs/api.md's table, the metrics' outcome and retry label sets (metrics.cc), the
//    failing-jobs alerts' outcomes (deploy/prometheus/alerts.yml) and the manager's retry decision
//    all come from it (exit_classification_test checks the documents).
//  - kExitRules: from (what the daemon had asked of the worker, what the worker reported, how its
//    process ended) to a reason; the first matching row wins.
//
// A new job outcome is one row in each table (and one in docs/api.md).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ftd/v1/job_spec.pb.h"
#include "ftd/v1/jobs.pb.h"
#include "server/executors/exit_status.h"

namespace ftd::server {

enum class Reason {
  kSucceeded,
  kCancelled,
  kInvalidSpec,
  kGpuOutOfMemory,
  kHostOutOfMemory,
  kNonFinite,
  kWorkerError,
  kKilledBySignal,
  kWorkerExit,
  kLostHeartbeat,
  kNoProgress,      // the progress watchdog: no step and no load/checkpoint progress for too long
  kSpawnFailed,
  kDaemonShort,     // the worker could not be started for want of the daemon's own resources
  kDaemonRestart,   // not a worker's exit: the daemon found the job RUNNING at start
  kDaemonShutdown,  // the daemon drained on SIGTERM
};

enum class Retry {
  kNever,             // the job's own outcome: final
  kWhileAttemptsLeft, // an infrastructure failure: requeued with backoff until max_attempts
  kFree,              // requeued at once, not counted as an attempt
  kFreeAfterBackoff,  // requeued with backoff, not counted as an attempt: the daemon's failure, not the job's
};

// Whose doing a failure is: the job's own (its spec, its size, its numbers: the user fixes it) or
// the service's (a worker that crashed, hung or could not start: the operator looks).
enum class Fault { kNone, kJob, kService };

struct ReasonInfo {
  Reason reason;
  std::string_view code;          // Job.reason; lower-cased, the metrics' outcome/reason label
  ftd::v1::JobState final_state;  // the job's state when this reason ends it (QUEUED: never ends it)
  Retry retry;
  Fault fault;  // kService: the failing-jobs alerts count it (FtdJobsFailing, FtdJobFailureRatioHigh)
};

inline constexpr ReasonInfo kReasons[] = {
    {Reason::kSucceeded, "SUCCEEDED", ftd::v1::SUCCEEDED, Retry::kNever, Fault::kNone},
    {Reason::kCancelled, "CANCELLED", ftd::v1::CANCELLED, Retry::kNever, Fault::kNone},
    {Reason::kInvalidSpec, "INVALID_SPEC", ftd::v1::FAILED, Retry::kNever, Fault::kJob},
    // Too large for the GPU or the worker's memory limit (FtdGpuOutOfMemory has the GPU's).
    {Reason::kGpuOutOfMemory, "GPU_OUT_OF_MEMORY", ftd::v1::FAILED, Retry::kNever, Fault::kJob},
    {Reason::kHostOutOfMemory, "HOST_OUT_OF_MEMORY", ftd::v1::FAILED, Retry::kNever, Fault::kJob},
    {Reason::kNonFinite, "NON_FINITE", ftd::v1::FAILED, Retry::kNever, Fault::kJob},
    {Reason::kWorkerError, "WORKER_ERROR", ftd::v1::FAILED, Retry::kNever, Fault::kService},
    {Reason::kKilledBySignal, "KILLED_BY_SIGNAL", ftd::v1::FAILED, Retry::kWhileAttemptsLeft, Fault::kService},
    {Reason::kWorkerExit, "WORKER_EXIT", ftd::v1::FAILED, Retry::kWhileAttemptsLeft, Fault::kService},
    {Reason::kLostHeartbeat, "LOST_HEARTBEAT", ftd::v1::FAILED, Retry::kWhileAttemptsLeft, Fault::kService},
    // A stuck training thread (blocked in a read, a hung collective) most likely hangs again: final.
    {Reason::kNoProgress, "NO_PROGRESS", ftd::v1::FAILED, Retry::kNever, Fault::kService},
    {Reason::kSpawnFailed, "SPAWN_FAILED", ftd::v1::FAILED, Retry::kWhileAttemptsLeft, Fault::kService},
    // ftd ran out of descriptors or memory for a pipe or a process: nothing the job did.
    {Reason::kDaemonShort, "DAEMON_SHORT_OF_RESOURCES", ftd::v1::QUEUED, Retry::kFreeAfterBackoff, Fault::kNone},
    {Reason::kDaemonRestart, "DAEMON_RESTART", ftd::v1::FAILED, Retry::kWhileAttemptsLeft, Fault::kService},
    {Reason::kDaemonShutdown, "DAEMON_SHUTDOWN", ftd::v1::QUEUED, Retry::kFree, Fault::kNone},
};

const ReasonInfo& Info(Reason r);

// What the daemon had asked of the worker or found out about it before it ended.
enum class Asked { kAny, kDrain, kCancel, kHeartbeatLost, kNoProgress };
// How the worker's process ended.
enum class Ended { kAny, kExitZero, kSignal, kOomKilled, kNotStarted, kDaemonShort };
// What the worker reported: a RunResult outcome, or one of these.
inline constexpr int kAnyReport = -1;
inline constexpr int kNoReport = ftd::v1::RunResult::OUTCOME_UNSPECIFIED;

struct ExitRule {
  Asked asked;
  int reported;  // a RunResult::Outcome, kAnyReport or kNoReport
  Ended ended;
  Reason reason;
};

// clang-format off
inline constexpr ExitRule kExitRules[] = {
    // the daemon asked    the worker reported                    its process          -> reason
    {Asked::kDrain,         kAnyReport,                            Ended::kAny,          Reason::kDaemonShutdown},
    {Asked::kCancel,        kAnyReport,                            Ended::kAny,          Reason::kCancelled},
    {Asked::kAny,           ftd::v1::RunResult::SUCCEEDED,         Ended::kExitZero,     Reason::kSucceeded},
    {Asked::kAny,           ftd::v1::RunResult::OUT_OF_MEMORY,     Ended::kAny,          Reason::kGpuOutOfMemory},
    {Asked::kAny,           ftd::v1::RunResult::INVALID_SPEC,      Ended::kAny,          Reason::kInvalidSpec},
    {Asked::kAny,           ftd::v1::RunResult::NON_FINITE,        Ended::kAny,          Reason::kNonFinite},
    {Asked::kAny,           ftd::v1::RunResult::FAILED,            Ended::kAny,          Reason::kWorkerError},
    // stopped by a SIGTERM/SIGINT that ftd did not send: someone outside ftd cancelled it
    {Asked::kAny,           ftd::v1::RunResult::CANCELLED,         Ended::kAny,          Reason::kCancelled},
    {Asked::kAny,           kAnyReport,                            Ended::kOomKilled,    Reason::kHostOutOfMemory},
    {Asked::kHeartbeatLost, kAnyReport,                            Ended::kAny,          Reason::kLostHeartbeat},
    {Asked::kNoProgress,    kAnyReport,                            Ended::kAny,          Reason::kNoProgress},
    {Asked::kAny,           kAnyReport,                            Ended::kSignal,       Reason::kKilledBySignal},
    {Asked::kAny,           kAnyReport,                            Ended::kDaemonShort,  Reason::kDaemonShort},
    {Asked::kAny,           kAnyReport,                            Ended::kNotStarted,   Reason::kSpawnFailed},
    {Asked::kAny,           kAnyReport,                            Ended::kAny,          Reason::kWorkerExit},
};
// clang-format on

// Everything known about one attempt when its worker is gone.
struct WorkerEnd {
  bool drain = false;           // the daemon was draining and asked it to stop
  bool cancel = false;          // a client cancelled the job
  bool heartbeat_lost = false;  // it went silent and the daemon killed it
  bool no_progress = false;     // the progress watchdog killed it
  std::string no_progress_detail;  // when no_progress: how long, and what it did last
  std::optional<ftd::v1::RunResult> result;  // what it reported, if anything
  bool started = true;          // false: the process could not be started
  ExitStatus exit;              // when started
  std::string start_error;      // when not started
  bool start_short = false;     // when not started: for want of the daemon's own resources (EMFILE, ENOMEM, ...)
};

struct Verdict {
  Reason reason;
  std::string message;       // for Job.message: the worker's own text or what the daemon saw
  bool from_report = false;  // the worker's RunResult decided it (and becomes the job's result)
};

// The first row of kExitRules that matches; never fails (the last row matches everything).
// `heartbeat_timeout_s` only words the LOST_HEARTBEAT message.
Verdict Classify(const WorkerEnd& end, int attempt, double heartbeat_timeout_s);

// A retried attempt n (1-based) waits base * 2^(n-1), at most max.
int64_t RetryDelayMs(int attempt, int64_t base_ms, int64_t max_ms);

}  // namespace ftd::server
