// Who may do what (docs/security.md): one function per action, each called by the handler before any
// work, with the caller's identity as the auth layer (server/auth/auth.h) established it. No gRPC here.
//
//   list the queue, get a job's public row anyone authenticated (other users' jobs without their spec)
//   read a job (spec, events, trace)       its owner, admins
//   change a job (cancel, delete, ...)     its owner, admins
//   submit for another owner               admins
//   priority above the cap                 admins
//   tokens, the audit log, the scheduler   admins
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "ftd/v1/admin.pb.h"
#include "ftd/v1/jobs.pb.h"

namespace ftd::server {

using Identity = ftd::v1::Identity;

bool IsAdmin(const Identity& who);

// PERMISSION_DENIED naming the owner unless `who` owns `job` or is an admin. `what`: "read the spec
// of", "watch", "download the trace of".
absl::Status MayReadJob(const Identity& who, const ftd::v1::Job& job, const std::string& what);
// Same rule, for changes: `action` is "cancel", "delete", "resubmit", ...
absl::Status MayChangeJob(const Identity& who, const ftd::v1::Job& job, const std::string& action);
// The owner a submit records: the caller, or `requested` when it is someone else and the caller is an admin.
absl::StatusOr<std::string> SubmitOwner(const Identity& who, const std::string& requested);
// The uid a job of `owner` submitted by `who` may run as (Job.owner_uid): the caller's own, when it
// is a local user on the unix socket submitting for itself; none for tokens, certificates and an
// admin submitting for someone else.
std::optional<uint32_t> OwnerUid(const Identity& who, const std::string& owner);
// Priorities above `cap` are for admins.
absl::Status MaySetPriority(const Identity& who, int priority, int cap);
// Admin-only actions: "create tokens", "read the audit log", "pause the scheduler", ...
absl::Status MayAdminister(const Identity& who, const std::string& action);

// A job as someone other than its owner (and not an admin) sees it, in a list and in GetJob: the
// public row (id, name, kind, owner, submitted_by, cancelled_by, priority, state, reason, position,
// attempts, slot, worker pid, phase, predicted peak, times) with public_only set; a queued job's
// message too while it only says why the job waits (queue, pause, quota, GPUs, memory). Withheld: the
// spec, every other message (a worker's error may quote the job's files), the step report, the
// result, the profile and the request id.
void RedactForOthers(const Identity& who, ftd::v1::Job* job);

}  // namespace ftd::server
