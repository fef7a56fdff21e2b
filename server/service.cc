#include "server/service.h"

#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "server/authz.h"
#include "server/handler.h"
#include "server/request_limits.h"

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

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                                    grpc::ByteBuffer* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  ftd::v1::SubmitJobRequest req;
  ftd::v1::SubmitJobResponse resp;
  reactor->Finish(Authed(auth_, ctx, &req, &resp, [&](const Identity& who) {
    std::vector<grpc::Slice> slices;
    if (!in->Dump(&slices).ok()) return ToGrpc(absl::InvalidArgumentError("the request could not be read"));
    std::string wire;
    for (const auto& s : slices) wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
    if (!req.ParseFromString(wire)) {
      const std::string field = FindInvalidUtf8(req.GetDescriptor(), wire);
      return ToGrpc(absl::InvalidArgumentError(
          field.empty() ? "the request is not a valid ftd.v1.SubmitJobRequest (malformed protobuf)"
                        : field + " is not valid UTF-8; send text encoded as UTF-8"));
    }
    if (auto st = Submit(who, req, &resp); !st.ok()) return st;
    bool own = false;
    return grpc::SerializationTraits<ftd::v1::SubmitJobResponse>::Serialize(resp, out, &own);
  }));
  return reactor;
}

grpc::Status JobServiceImpl::Submit(const Identity& who, const ftd::v1::SubmitJobRequest& req,
                                    ftd::v1::SubmitJobResponse* resp) {
  auto owner = SubmitOwner(who, req.owner());
  if (!owner.ok()) return ToGrpc(owner.status());
  if (auto st = MaySetPriority(who, req.priority(), priority_cap_); !st.ok()) return ToGrpc(st);
  ftd::v1::SubmitJobRequest r = req;
  r.set_owner(*owner);
  auto out = m_->Submit(r, who.user());
  if (!out.ok()) return ToGrpc(out.status());
  // A request_id another user's job already carries names that job: it is not this caller's to see.
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
    if (auto st = MayReadJob(who, *r, "read the spec of"); !st.ok()) return ToGrpc(st);
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
    auto r = m_->Cancel(req->id(), who.user());
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
    std::ifstream in(*path, std::ios::binary);
    if (!in) return ToGrpc(absl::NotFoundError("the trace of job " + req->id() + " cannot be read"));
    in.seekg(0, std::ios::end);
    const int64_t total = static_cast<int64_t>(in.tellg());
    in.seekg(0);
    constexpr size_t kChunk = 1 << 20;
    std::string buf(kChunk, '\0');
    ftd::v1::TraceChunk chunk;
    chunk.set_total_bytes(total);
    while (in && !ctx->IsCancelled()) {
      in.read(buf.data(), static_cast<std::streamsize>(kChunk));
      const auto n = static_cast<size_t>(in.gcount());
      if (n == 0) break;
      chunk.set_data(buf.data(), n);
      if (!writer->Write(chunk)) return ClientGone();
    }
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
