#include "server/auth/authz.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace ftd::server {

bool IsAdmin(const Identity& who) { return who.role() == ftd::v1::ROLE_ADMIN; }

namespace {

bool SeesAll(const Identity& who, const ftd::v1::Job& job) {
  return IsAdmin(who) || (!who.user().empty() && who.user() == job.owner());
}

// The reasons a queued job's message only explains its wait (JobManager::AnnotateLocked): computed
// from the queue, the scheduler and the quotas, never from the job's files. A job waiting out a retry's
// backoff keeps its failure's reason code and message, which stay private.
bool SaysOnlyWhyItWaits(const ftd::v1::Job& job) {
  static constexpr std::array<std::string_view, 5> kWaits = {"WAITING_FOR_SLOT", "PAUSED", "QUOTA",
                                                             "WAITING_FOR_GPUS", "WAITING_FOR_MEMORY"};
  return job.state() == ftd::v1::QUEUED && std::find(kWaits.begin(), kWaits.end(), job.reason()) != kWaits.end();
}

absl::Status OwnerOrAdmin(const Identity& who, const ftd::v1::Job& job, const std::string& verb) {
  if (SeesAll(who, job)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("job ", job.id(), " belongs to ", job.owner(), ": only ", job.owner(),
                                                  " or an admin may ", verb, " it (you are ", who.user(), ")"));
}

}  // namespace

absl::Status MayReadJob(const Identity& who, const ftd::v1::Job& job, const std::string& what) {
  return OwnerOrAdmin(who, job, what);
}

absl::Status MayChangeJob(const Identity& who, const ftd::v1::Job& job, const std::string& action) {
  return OwnerOrAdmin(who, job, action);
}

absl::StatusOr<std::string> SubmitOwner(const Identity& who, const std::string& requested) {
  if (requested.empty() || requested == who.user()) return who.user();
  if (IsAdmin(who)) return requested;
  return absl::PermissionDeniedError(absl::StrCat("owner \"", requested, "\": only an admin may submit for another user (you are ",
                                                  who.user(), "; leave owner empty to submit as yourself)"));
}

std::optional<uint32_t> OwnerUid(const Identity& who, const std::string& owner) {
  if (!who.has_local_uid() || who.user() != owner) return std::nullopt;
  return who.local_uid();
}

absl::Status MaySetPriority(const Identity& who, int priority, int cap) {
  if (priority <= cap || IsAdmin(who)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("priority ", priority, " is above ", cap,
                                                  ", the highest a user may set; only an admin may go higher"));
}

absl::Status MayAdminister(const Identity& who, const std::string& action) {
  if (IsAdmin(who)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("only an admin may ", action, " (you are ", who.user(), ", a user)"));
}

void RedactForOthers(const Identity& who, ftd::v1::Job* job) {
  if (SeesAll(who, *job)) return;
  job->set_public_only(true);
  job->clear_spec();
  if (!SaysOnlyWhyItWaits(*job)) job->clear_message();
  job->clear_last_step();
  job->clear_result();
  job->clear_profile();
  job->clear_request_id();
}

}  // namespace ftd::server
