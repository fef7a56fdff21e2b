// Admission: a submit request checked and stored, or refused with the field and the fix. The request's
// bounds (strings, request id, priority, max attempts), the spec validated against this daemon (the
// sandbox's roots, its input files, the predicted peak memory against the machine), the GPU-hours
// quota, then the insert with the queue limits in its transaction; a request id seen before returns
// its job. validate_only answers with the placement instead. Resubmit builds a new request from a
// finished job, and with resume stages a copy of its newest checkpoint for the new job.
#include "server/common/local_users.h"
#include "server/jobs/job_manager.h"

#include <filesystem>
#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/policy/exit_classification.h"
#include "server/requests/input_contents.h"
#include "server/store/job_files.h"
#include "server/common/log.h"
#include "server/policy/memory_fit.h"
#include "server/requests/request_limits.h"
#include "server/requests/request_match.h"
#include "spec/input_files.h"
#include "spec/message_check.h"
#include "spec/peak_memory.h"
#include "spec/sandbox.h"
#include "spec/spec.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

absl::StatusOr<ftd::v1::SubmitJobResponse> JobManager::SubmitWith(
    const ftd::v1::SubmitJobRequest& in, const std::string& submitted_by, std::optional<uint32_t> owner_uid,
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
  std::optional<ftd::spec::Roots> roots;
  if (cfg_.sandbox.enabled()) {
    auto r = cfg_.sandbox.RootsFor(req.owner());
    if (!r.ok()) return r.status();
    if (auto st = ftd::spec::ConfineSpecPaths(*r, req.mutable_spec()); !st.ok()) return st;
    roots = *std::move(r);
  }
  ftd::spec::Environment env;
  env.name = "this ftd";
  env.gpus = cfg_.gpus > 0 ? 1 : 0;  // a job gets one GPU, which it sees as cuda:0
  env.gpu_compute_capability = cfg_.gpu_compute_capability;
  env.host_gpus = cfg_.gpus;          // or spec.gpus of them, all of one host
  auto config = ftd::spec::Validate(req.spec(), env);
  if (!config.ok()) return config.status();
  // Without roots the workers open the spec's paths with their own rights: a local user's job names
  // only what its owner could use (root's workers would read /etc/shadow for anyone otherwise).
  if (!cfg_.sandbox.enabled() && owner_uid.has_value() && *owner_uid != 0 && *owner_uid != cfg_.workers_uid &&
      !cfg_.workers_as_owner) {
    auto owner = LookUpOwner(*owner_uid);
    if (!owner.ok()) return owner.status();
    if (auto st = ftd::spec::CheckUserMayUse(*config, {owner->name, owner->uid, owner->gid, owner->groups}); !st.ok()) {
      return st;
    }
  }
  if (auto st = ftd::spec::CheckInputFiles(*config); !st.ok()) return st;
  // What the files hold: a bad line's reason may quote it, so it is told for the caller's own files
  // only (docs/security.md).
  InputContentOptions contents;
  for (const std::string* p : {&config->data.path, &config->data.eval_path}) {
    if (roots.has_value() && !p->empty() &&
        (roots->writable.empty() || !ftd::spec::Beneath(*p, roots->writable))) {
      contents.may_quote = false;
    }
  }
  std::vector<std::string> notes;
  if (auto st = CheckInputContents(*config, contents, &notes); !st.ok()) return st;
  const bool gpu = cfg_.gpus > 0 && config->device != "cpu";
  int64_t predicted = 0;
  if (auto model = ModelShape(*config, gpu); model.has_value()) {
    if (auto st = ftd::spec::CheckSequenceLength(*model, config->seq_len, config->ModelOrigin()); !st.ok()) return st;
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
          "user %s has used %.1f %s in the last %s, the limit for the user (gpu-hours=%g); submit again "
          "once older use has left the window, or ask an admin to raise the limit",
          owner, used, UsageUnit(), HoursText(cfg_.quotas.window_ms), limits.gpu_hours));
    }
  }
  Job job;
  job.set_name(req.name());
  job.set_kind(req.kind() == ftd::v1::JOB_KIND_UNSPECIFIED ? ftd::v1::FINETUNE : req.kind());
  job.set_owner(owner);
  job.set_submitted_by(submitted_by);
  if (owner_uid.has_value()) job.set_owner_uid(*owner_uid);
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
    for (auto& n : notes) resp.add_notes(std::move(n));
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
      FtdLog() << "job " << j.id() << " submitted: " << ftd::v1::JobKind_Name(j.kind()) << " \"" << j.name()
               << "\" by " << j.owner() << ", priority " << j.priority() << ", " << j.max_attempts() << " attempt(s)";
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

absl::StatusOr<ftd::v1::SubmitJobResponse> JobManager::Resubmit(const ftd::v1::ResubmitJobRequest& req,
                                                                const std::string& submitted_by,
                                                                std::optional<uint32_t> owner_uid) {
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
  if (!req.resume()) return Submit(sub, submitted_by, owner_uid);
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
  // The job's own directory may be its worker's user's: resolved beneath the data directory, never
  // through a link swapped in there (OpenDirBeneath).
  const std::string old_rel = absl::StrCat("jobs/", req.id(), "/checkpoints");
  const std::string old_dir = ck.has_dir() ? ck.dir() : (fs::path(cfg_.data_dir) / old_rel).string();
  auto newest = ck.has_dir() ? NewestCheckpoint(old_dir) : NewestCheckpoint(cfg_.data_dir, old_rel);
  if (!newest.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", req.id(), " has no complete checkpoint in ", old_dir,
                                                      " (cancel --checkpoint writes one); resubmit without --resume "
                                                      "to start over"));
  }
  // A spec with a directory of its own resumes from it as it is. Otherwise the new job gets a copy
  // of the newest checkpoint (hard links), staged before the job exists and moved into its
  // directory before it can start.
  if (ck.has_dir()) return Submit(sub, submitted_by, owner_uid);
  const fs::path staging = fs::path(cfg_.data_dir) / "jobs" / absl::StrCat(".resume-", NewToken());
  const fs::path staged = staging / fs::path(*newest).filename();
  const std::string newest_rel = absl::StrCat(old_rel, "/", fs::path(*newest).filename().string());
  if (auto st = LinkOrCopyTree(cfg_.data_dir, newest_rel, staged.string()); !st.ok()) {
    (void)RemoveTree(staging.string());
    return st;
  }
  auto resp = SubmitWith(sub, submitted_by, owner_uid, [&](const Job& job) -> absl::Status {
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

}  // namespace ftd::server
