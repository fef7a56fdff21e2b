#include "server/service.h"

#include <exception>
#include <fstream>

namespace ftd::server {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), std::string(s.message()));
}

namespace {

// No handler lets an exception escape: anything thrown becomes INTERNAL with its text.
template <typename F>
grpc::Status Guard(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "internal error");
  }
}

absl::Status RequireId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id is required (a job id such as j-000001; ftctl list shows them)");
  return absl::OkStatus();
}

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext*, const ftd::v1::SubmitJobRequest* req,
                                       ftd::v1::SubmitJobResponse* resp) {
  return Guard([&] {
    auto r = m_->Submit(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
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
    if (req->after_seq() < 0) return ToGrpc(absl::InvalidArgumentError("after_seq must be >= 0"));
    int64_t after = req->after_seq();
    while (!ctx->IsCancelled()) {
      if (stopping_->load()) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "ftd is shutting down; reconnect with after_seq");
      }
      bool done = false;
      auto events = m_->Events(req->id(), after, std::chrono::milliseconds(500), &done);
      if (!events.ok()) return ToGrpc(events.status());
      for (const auto& e : *events) {
        if (!writer->Write(e)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
        after = e.seq();
      }
      if (done) return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
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
      if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
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
