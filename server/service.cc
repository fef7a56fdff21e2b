#include "server/service.h"

#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"
#include "server/request_limits.h"

namespace ftd::server {

namespace {

// No handler lets an exception escape: anything thrown becomes INTERNAL with its text.
template <typename F>
grpc::Status Guard(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return ToGrpc(absl::InternalError(std::string("internal error: ") + e.what()));
  } catch (...) {
    return ToGrpc(absl::InternalError("internal error"));
  }
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
  reactor->Finish(Guard([&] {
    std::vector<grpc::Slice> slices;
    if (!in->Dump(&slices).ok()) return ToGrpc(absl::InvalidArgumentError("the request could not be read"));
    std::string wire;
    for (const auto& s : slices) wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
    ftd::v1::SubmitJobRequest req;
    if (!req.ParseFromString(wire)) {
      const std::string field = FindInvalidUtf8(req.GetDescriptor(), wire);
      return ToGrpc(absl::InvalidArgumentError(
          field.empty() ? "the request is not a valid ftd.v1.SubmitJobRequest (malformed protobuf)"
                        : field + " is not valid UTF-8; send text encoded as UTF-8"));
    }
    ftd::v1::SubmitJobResponse resp;
    if (auto st = Submit(ctx, req, &resp); !st.ok()) return st;
    bool own = false;
    return grpc::SerializationTraits<ftd::v1::SubmitJobResponse>::Serialize(resp, out, &own);
  }));
  return reactor;
}

grpc::Status JobServiceImpl::Submit(grpc::ServerContextBase*, const ftd::v1::SubmitJobRequest& req,
                                    ftd::v1::SubmitJobResponse* resp) {
  auto r = m_->Submit(req);
  if (!r.ok()) return ToGrpc(r.status());
  *resp = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const ftd::v1::GetJobRequest* req, ftd::v1::Job* resp) {
  return Guard([&] {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    auto r = m_->Get(req->id());
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const ftd::v1::ListJobsRequest* req,
                                      ftd::v1::ListJobsResponse* resp) {
  return Guard([&] {
    auto r = m_->List(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const ftd::v1::CancelJobRequest* req, ftd::v1::Job* resp) {
  return Guard([&] {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
    auto r = m_->Cancel(req->id());
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* ctx, const ftd::v1::WatchJobRequest* req,
                                      grpc::ServerWriter<ftd::v1::JobEvent>* writer) {
  return Guard([&] {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
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
  return Guard([&] {
    if (auto st = RequireId(req->id()); !st.ok()) return ToGrpc(st);
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
