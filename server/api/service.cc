#include "server/api/service.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "server/auth/authz.h"
#include "server/api/handler.h"
#include "server/jobs/job_log.h"
#include "server/requests/request_limits.h"

namespace ftd::server {

namespace {

// The job's owner or an admin: the job exists and `who` may read it.
absl::Status MayRead(JobManager* m, const Identity& who, const std::string& id, const std::string& what) {
  auto job = m->Get(id);
  if (!job.ok()) return job.status();
  return MayReadJob(who, *job, what);
}

grpc::Status ClientGone() { return ToGrpc(absl::CancelledError("client went away")); }

absl::Status RequireId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id is required (a job id such as j-000001; ftctl list shows them)");
  if (id.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("id must be at most ", kMaxNameBytes, " bytes (got ", id.size(),
                                                   " bytes: \"", Clip(id, 48), "\"); job ids look like j-000001"));
  }
  return absl::OkStatus();
}

}  // namespace

JobServiceImpl::JobServiceImpl(JobManager* m, const std::atomic<bool>* stopping, const CallAuth* auth,
                               int priority_cap)
    : ParsedService("ftd.v1.JobService", Authenticated(auth)),
      m_(m),
      stopping_(stopping),
      auth_(auth),
      priority_cap_(priority_cap) {
  Register("SubmitJob", &JobServiceImpl::SubmitJob);
  Register("GetJob", &JobServiceImpl::GetJob);
  Register("ListJobs", &JobServiceImpl::ListJobs);
  Register("CancelJob", &JobServiceImpl::CancelJob);
  Register("WatchJob", &JobServiceImpl::WatchJob);
  Register("GetTrace", &JobServiceImpl::GetTrace);
  Register("DeleteJob", &JobServiceImpl::DeleteJob);
  Register("PruneJobs", &JobServiceImpl::PruneJobs);
  Register("ResubmitJob", &JobServiceImpl::ResubmitJob);
  Register("GetLogs", &JobServiceImpl::GetLogs);
  Register("PauseScheduler", &JobServiceImpl::PauseScheduler);
  Register("ResumeScheduler", &JobServiceImpl::ResumeScheduler);
  Register("GetScheduler", &JobServiceImpl::GetScheduler);
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* ctx, const ftd::v1::SubmitJobRequest* req,
                                       ftd::v1::SubmitJobResponse* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) { return Submit(who, *req, resp); });
}

grpc::Status JobServiceImpl::Submit(const Identity& who, const ftd::v1::SubmitJobRequest& req,
                                    ftd::v1::SubmitJobResponse* resp) {
  auto owner = SubmitOwner(who, req.owner());
  if (!owner.ok()) return ToGrpc(owner.status());
  if (auto st = MaySetPriority(who, req.priority(), priority_cap_); !st.ok()) return ToGrpc(st);
  ftd::v1::SubmitJobRequest r = req;
  r.set_owner(*owner);
  auto out = m_->Submit(r, who.user(), OwnerUid(who, *owner));
  if (!out.ok()) return ToGrpc(out.status());
  // Request ids are per owner, so a job found by one is the owner's, whom the caller is or (an admin)
  // submits for; should that ever not hold, the caller learns nothing of the job.
  if (!out->created()) {
    if (auto st = MayReadJob(who, out->job(), "see"); !st.ok()) {
      return ToGrpc(absl::AlreadyExistsError(absl::StrCat("request_id \"", req.request_id(),
                                                          "\" is taken by another user's job; choose another")));
    }
  }
  *resp = std::move(*out);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* ctx, const ftd::v1::GetJobRequest* req, ftd::v1::Job* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    auto r = m_->Get(req->id());
    if (!r.ok()) return ToGrpc(r.status());
    // The job table is public: another user's job answers with the row ListJobs shows; the spec
    // only to its owner and admins.
    if (req->full()) {
      if (auto st = MayReadJob(who, *r, "read the spec of"); !st.ok()) return ToGrpc(st);
    }
    RedactForOthers(who, &*r);
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* ctx, const ftd::v1::ListJobsRequest* req,
                                      ftd::v1::ListJobsResponse* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    auto r = m_->List(*req);
    if (!r.ok()) return ToGrpc(r.status());
    for (auto& j : *r->mutable_jobs()) RedactForOthers(who, &j);
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* ctx, const ftd::v1::CancelJobRequest* req,
                                       ftd::v1::Job* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    auto job = m_->Get(req->id());
    if (!job.ok()) return ToGrpc(job.status());
    if (auto st = MayChangeJob(who, *job, "cancel"); !st.ok()) return ToGrpc(st);
    auto r = m_->Cancel(req->id(), who.user(), req->checkpoint());
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const ftd::v1::WatchJobRequest* req,
                                      grpc::ServerWriter<ftd::v1::JobEvent>* writer) {
  return Authed(auth_, ctx, req, nullptr, [&](const Identity& who) {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    if (auto st = MayRead(m_, who, req->id(), "watch"); !st.ok()) return ToGrpc(st);
    auto watch = m_->WatchJob(req->id(), req->after_seq());
    if (!watch.ok()) return ToGrpc(watch.status());
    // New events wake the wait at once; the bound only lets a silent watch notice a client that left.
    constexpr std::chrono::seconds kCheckClient{1};
    while (!ctx->IsCancelled()) {
      if (stopping_->load()) return ToGrpc(absl::UnavailableError("ftd is shutting down; reconnect with after_seq"));
      bool done = false;
      auto events = (*watch)->Next(kCheckClient, &done);
      if (!events.ok()) return ToGrpc(events.status());
      for (const auto& e : *events) {
        if (!writer->Write(e)) return ClientGone();
      }
      if (done) return grpc::Status::OK;
    }
    return ClientGone();
  });
}

grpc::Status JobServiceImpl::GetTrace(grpc::ServerContext* ctx, const ftd::v1::GetTraceRequest* req,
                                      grpc::ServerWriter<ftd::v1::TraceChunk>* writer) {
  return Authed(auth_, ctx, req, nullptr, [&](const Identity& who) {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    if (auto st = MayRead(m_, who, req->id(), "download the trace of"); !st.ok()) return ToGrpc(st);
    auto path = m_->TracePath(req->id());
    if (!path.ok()) return ToGrpc(path.status());
    // Never through a link: the job's directory may belong to the workers' user (--worker-user).
    const int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      if (fd >= 0) ::close(fd);
      return ToGrpc(absl::NotFoundError("the trace of job " + req->id() + " cannot be read"));
    }
    constexpr size_t kChunk = 1 << 20;
    std::string buf(kChunk, '\0');
    ftd::v1::TraceChunk chunk;
    chunk.set_total_bytes(static_cast<int64_t>(st.st_size));
    while (!ctx->IsCancelled()) {
      const ssize_t n = ::read(fd, buf.data(), kChunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      chunk.set_data(buf.data(), static_cast<size_t>(n));
      if (!writer->Write(chunk)) {
        ::close(fd);
        return ClientGone();
      }
    }
    ::close(fd);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::DeleteJob(grpc::ServerContext* ctx, const ftd::v1::DeleteJobRequest* req,
                                       ftd::v1::DeleteJobResponse* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    auto job = m_->Get(req->id());
    if (!job.ok()) return ToGrpc(job.status());
    if (auto st = MayChangeJob(who, *job, "delete"); !st.ok()) return ToGrpc(st);
    auto r = m_->Delete(req->id());
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_id(req->id());
    resp->set_freed_bytes(r->freed_bytes);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::PruneJobs(grpc::ServerContext* ctx, const ftd::v1::PruneJobsRequest* req,
                                       ftd::v1::PruneJobsResponse* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (req->older_than_seconds() < 0) {
      return ToGrpc(absl::InvalidArgumentError(
          absl::StrCat("older_than_seconds must be >= 0 (got ", req->older_than_seconds(), ")")));
    }
    PruneFilter f;
    f.older_than_ms = req->older_than_seconds() * 1000;
    for (int s : req->states()) f.states.push_back(static_cast<ftd::v1::JobState>(s));
    // A user prunes their own jobs; an admin anyone's (or everyone's, with no owner).
    f.owner = req->owner().empty() && !IsAdmin(who) ? who.user() : req->owner();
    if (f.owner != who.user()) {
      if (auto st = MayAdminister(who, "prune other users' jobs"); !st.ok()) return ToGrpc(st);
    }
    f.dry_run = req->dry_run();
    auto r = m_->Prune(f);
    if (!r.ok()) return ToGrpc(r.status());
    for (auto& id : r->ids) resp->add_ids(std::move(id));
    resp->set_freed_bytes(r->freed_bytes);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::ResubmitJob(grpc::ServerContext* ctx, const ftd::v1::ResubmitJobRequest* req,
                                         ftd::v1::SubmitJobResponse* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    auto job = m_->Get(req->id());
    if (!job.ok()) return ToGrpc(job.status());
    // The new job is submitted by the caller for the original's owner: the same checks as a submit.
    if (auto st = MayReadJob(who, *job, "resubmit"); !st.ok()) return ToGrpc(st);
    auto owner = SubmitOwner(who, job->owner());
    if (!owner.ok()) return ToGrpc(owner.status());
    if (auto st = MaySetPriority(who, job->priority(), priority_cap_); !st.ok()) return ToGrpc(st);
    auto r = m_->Resubmit(*req, who.user(), OwnerUid(who, *owner));
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::GetLogs(grpc::ServerContext* ctx, const ftd::v1::GetLogsRequest* req,
                                     grpc::ServerWriter<ftd::v1::LogChunk>* writer) {
  return Authed(auth_, ctx, req, nullptr, [&](const Identity& who) {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    if (auto st = MayRead(m_, who, req->id(), "read the log of"); !st.ok()) return ToGrpc(st);
    ftd::v1::LogChunk chunk;
    auto st = StreamJobLog(
        m_, req->id(), req->follow(), req->tail_bytes(), req->offset(),
        [&](int64_t offset, std::string_view data) {
          chunk.set_offset(offset);
          chunk.set_data(data.data(), data.size());
          return writer->Write(chunk);
        },
        [&] { return ctx->IsCancelled() || stopping_->load(); }, req->tail_lines());
    if (absl::IsCancelled(st) && stopping_->load()) {
      return ToGrpc(absl::UnavailableError("ftd is shutting down; run ftctl logs again once it is back"));
    }
    return ToGrpc(st);
  });
}

grpc::Status JobServiceImpl::PauseScheduler(grpc::ServerContext* ctx, const ftd::v1::SchedulerRequest* req,
                                            ftd::v1::SchedulerState* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = MayAdminister(who, "pause the scheduler"); !st.ok()) return ToGrpc(st);
    *resp = m_->SetPaused(true);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::ResumeScheduler(grpc::ServerContext* ctx, const ftd::v1::SchedulerRequest* req,
                                             ftd::v1::SchedulerState* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = MayAdminister(who, "resume the scheduler"); !st.ok()) return ToGrpc(st);
    *resp = m_->SetPaused(false);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::GetScheduler(grpc::ServerContext* ctx, const ftd::v1::SchedulerRequest* req,
                                          ftd::v1::SchedulerState* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity&) {
    *resp = m_->Scheduler();
    return grpc::Status::OK;
  });
}

grpc::Status WorkerServiceImpl::GetAssignment(grpc::ServerContext*, const ftd::v1::WorkerHello* req,
                                              ftd::v1::Assignment* resp) {
  return Guard([&] {
    auto r = m_->Assign(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status WorkerServiceImpl::Stream(grpc::ServerContext*, grpc::ServerReader<ftd::v1::WorkerMessage>* reader,
                                       ftd::v1::WorkerAck* ack) {
  return Guard([&] {
    ftd::v1::WorkerMessage msg;
    while (reader->Read(&msg)) {
      auto cancel = m_->OnWorkerMessage(msg);
      if (!cancel.ok()) return ToGrpc(cancel.status());
      if (*cancel) ack->set_cancel(true);
    }
    return grpc::Status::OK;
  });
}

}  // namespace ftd::server
