#include "server/policy/exit_classification.h"

#include <string.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/bytes.h"

namespace ftd::server {

std::string Describe(const ExitStatus& st) {
  if (!st.signaled) return absl::StrCat("exit code ", st.code);
  const char* abbrev = sigabbrev_np(st.signal);
  return abbrev == nullptr ? absl::StrCat("killed by signal ", st.signal)
                           : absl::StrCat("killed by signal ", st.signal, " (SIG", abbrev, ")");
}

const ReasonInfo& Info(Reason r) {
  for (const auto& info : kReasons) {
    if (info.reason == r) return info;
  }
  return kReasons[0];  // unreachable: every Reason has a row (exit_classification_test checks)
}

namespace {

std::string Bytes(int64_t b) { return ftd::spec::FormatBytes(static_cast<double>(b)); }

bool Matches(const ExitRule& rule, const WorkerEnd& end) {
  switch (rule.asked) {
    case Asked::kAny: break;
    case Asked::kDrain: if (!end.drain) return false; break;
    case Asked::kCancel: if (!end.cancel) return false; break;
    case Asked::kHeartbeatLost: if (!end.heartbeat_lost) return false; break;
    case Asked::kNoProgress: if (!end.no_progress) return false; break;
  }
  const int reported = end.result.has_value() ? end.result->outcome() : kNoReport;
  if (rule.reported != kAnyReport && rule.reported != reported) return false;
  switch (rule.ended) {
    case Ended::kAny: return true;
    case Ended::kExitZero: return end.started && !end.exit.signaled && end.exit.code == 0;
    case Ended::kSignal: return end.started && end.exit.signaled;
    case Ended::kOomKilled: return end.started && end.exit.oom_killed;
    case Ended::kNotStarted: return !end.started;
    case Ended::kDaemonShort: return !end.started && end.start_short;
  }
  return false;
}

}  // namespace

Verdict Classify(const WorkerEnd& end, int attempt, double heartbeat_timeout_s) {
  const ExitRule* rule = &kExitRules[std::size(kExitRules) - 1];
  for (const auto& r : kExitRules) {
    if (Matches(r, end)) {
      rule = &r;
      break;
    }
  }
  const std::string how = Describe(end.exit);
  const std::string reported = end.result.has_value() ? end.result->message() : "";
  Verdict v{rule->reason, "", rule->reported != kAnyReport};
  switch (rule->reason) {
    case Reason::kDaemonShutdown:
      v.message = absl::StrCat("ftd shut down while attempt ", attempt, " ran (",
                               end.started ? "worker " + how : "no worker was started", "); requeued");
      break;
    case Reason::kCancelled:
      if (end.cancel) {
        v.message = absl::StrCat("cancelled on request; ",
                                 end.started ? "worker stopped (" + how + ")" : "no worker was started");
      } else {
        v.message = absl::StrCat("cancelled from outside ftd: the worker was stopped by a SIGTERM or SIGINT that ftd "
                                 "did not send, and reported \"", reported, "\" (worker ", how, ")");
      }
      break;
    case Reason::kSucceeded:
    case Reason::kGpuOutOfMemory:
    case Reason::kInvalidSpec:
    case Reason::kNonFinite:
      v.message = reported;
      break;
    case Reason::kWorkerError:
      v.message = absl::StrCat(reported, " (worker ", how, ")");
      break;
    case Reason::kLostHeartbeat:
      v.message = absl::StrCat("no message from the worker for ", heartbeat_timeout_s,
                               "s; its process group was killed");
      break;
    case Reason::kHostOutOfMemory:
      v.message = absl::StrCat("the kernel's OOM killer killed the worker (", how, "): ",
                               end.exit.memory_limit_bytes > 0
                                   ? absl::StrCat("it reached its memory limit of ", Bytes(end.exit.memory_limit_bytes),
                                                  " (peak ", Bytes(end.exit.memory_peak_bytes), ")")
                                   : std::string("the host ran out of memory"),
                               "; lower spec.batch_size or spec.seq_len (ftd's --worker-memory-max sets the limit)");
      break;
    case Reason::kNoProgress:
      v.message = absl::StrCat("stuck: ", end.no_progress_detail, "; its process group was killed");
      break;
    case Reason::kKilledBySignal:
      v.message = absl::StrCat("worker ", how);
      break;
    case Reason::kSpawnFailed:
      v.message = absl::StrCat("could not start the worker: ", end.start_error);
      break;
    case Reason::kDaemonShort:
      v.message = absl::StrCat("ftd could not start the worker for want of a resource of its own (", end.start_error,
                               "); the attempt is not counted and the job is retried after a pause");
      break;
    case Reason::kWorkerExit:
    case Reason::kDaemonRestart:  // not an exit rule (the restart recovery words its own message)
      v.message = end.result.has_value()
                      ? absl::StrCat("worker ended with ", how, " after reporting ",
                                     ftd::v1::RunResult::Outcome_Name(end.result->outcome()))
                      : absl::StrCat("worker ended with ", how, " before reporting a result");
      break;
  }
  return v;
}

int64_t RetryDelayMs(int attempt, int64_t base_ms, int64_t max_ms) {
  const int shift = std::clamp(attempt - 1, 0, 30);
  return std::min<int64_t>(max_ms, base_ms << shift);
}

}  // namespace ftd::server
