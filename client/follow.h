// Following a job to its end, shared by watch, wait and submit --wait: Ctrl-C stops following (not
// the job), a lost connection is reported and resumed after the last event shown.
#pragma once

#include <string>

#include "client/job_client.h"

namespace ftd::client {

enum class FollowOutput { kNone, kText, kJson };

// Follows `id` until its result; `output` says how each event is shown. Returns the exit code: the
// job's outcome (ExitCodeForState), kExitCallFailed, or kExitInterrupted on Ctrl-C.
int Follow(JobClient& client, const std::string& id, FollowOutput output);

// After a wait: "ID STATE: message" on `out` when the job ended (rc 0..2).
void PrintOutcome(JobClient& client, const std::string& id, int rc, std::ostream& out);

// What submit and resubmit do with ftd's answer: print the job's id (saying when the request id named
// an existing job) and, with `wait`, follow it to its end. Returns the exit code.
int Submitted(JobClient& client, const absl::StatusOr<ftd::v1::SubmitJobResponse>& resp, bool wait);

}  // namespace ftd::client
