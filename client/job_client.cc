#include "client/job_client.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ftd::client {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())), s.error_message());
}

namespace {

bool Retryable(const grpc::Status& s) { return s.error_code() == grpc::StatusCode::UNAVAILABLE; }

std::chrono::milliseconds Backoff(int attempt) {
  return std::chrono::milliseconds(std::min(2000, 100 << std::min(attempt, 5)));
}

}  // namespace

JobClient::JobClient(ClientOptions opts) : opts_(std::move(opts)) {
  grpc::ChannelArguments args;
  // Reconnect quickly after a daemon restart instead of gRPC's default of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(opts_.address, grpc::InsecureChannelCredentials(), args);
  stub_ = ftd::v1::JobService::NewStub(channel_);
}

template <typename Resp, typename Call>
absl::StatusOr<Resp> JobClient::Unary(Call&& call) {
  const auto deadline = std::chrono::system_clock::now() + opts_.timeout;
  grpc::Status last;
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    Resp resp;
    last = call(&ctx, &resp);
    if (last.ok()) return resp;
    if (!Retryable(last)) break;
    const auto wake = std::chrono::system_clock::now() + Backoff(attempt);
    if (wake >= deadline) break;
    std::this_thread::sleep_until(wake);
  }
  if (last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || last.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(last.error_code())),
                        absl::StrCat("no answer from ftd at ", opts_.address, " within ", opts_.timeout.count() / 1000.0,
                                     " s (", last.error_message(),
                                     "); is ftd running there? (--addr, FTD_ADDR or the config file set the address)"));
  }
  return FromGrpc(last);
}

absl::StatusOr<ftd::v1::SubmitJobResponse> JobClient::Submit(const ftd::v1::SubmitJobRequest& req) {
  return Unary<ftd::v1::SubmitJobResponse>(
      [&](grpc::ClientContext* c, ftd::v1::SubmitJobResponse* r) { return stub_->SubmitJob(c, req, r); });
}

absl::StatusOr<ftd::v1::Job> JobClient::Get(const std::string& id) {
  ftd::v1::GetJobRequest req;
  req.set_id(id);
  return Unary<ftd::v1::Job>([&](grpc::ClientContext* c, ftd::v1::Job* r) { return stub_->GetJob(c, req, r); });
}

absl::StatusOr<ftd::v1::ListJobsResponse> JobClient::List(const ftd::v1::ListJobsRequest& req) {
  return Unary<ftd::v1::ListJobsResponse>(
      [&](grpc::ClientContext* c, ftd::v1::ListJobsResponse* r) { return stub_->ListJobs(c, req, r); });
}

absl::StatusOr<ftd::v1::Job> JobClient::Cancel(const std::string& id) {
  ftd::v1::CancelJobRequest req;
  req.set_id(id);
  return Unary<ftd::v1::Job>([&](grpc::ClientContext* c, ftd::v1::Job* r) { return stub_->CancelJob(c, req, r); });
}

absl::Status JobClient::DownloadTrace(const std::string& id, std::ostream& out, int64_t* bytes) {
  grpc::ClientContext ctx;
  // Big traces take a while; the deadline covers the whole transfer, generously.
  ctx.set_deadline(std::chrono::system_clock::now() + std::max(opts_.timeout, std::chrono::milliseconds(600000)));
  ftd::v1::GetTraceRequest req;
  req.set_id(id);
  auto reader = stub_->GetTrace(&ctx, req);
  ftd::v1::TraceChunk chunk;
  *bytes = 0;
  int64_t total = -1;
  while (reader->Read(&chunk)) {
    out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    *bytes += static_cast<int64_t>(chunk.data().size());
    total = chunk.total_bytes();
  }
  if (auto st = FromGrpc(reader->Finish()); !st.ok()) return st;
  if (!out) return absl::DataLossError("could not write the trace file");
  if (total >= 0 && total != *bytes) {
    return absl::DataLossError(absl::StrCat("the trace arrived incomplete (", *bytes, " of ", total, " bytes)"));
  }
  return absl::OkStatus();
}

void JobClient::Interrupt() {
  std::lock_guard<std::mutex> l(mu_);
  interrupted_ = true;
  if (active_ != nullptr) active_->TryCancel();
}

absl::Status JobClient::Watch(const std::string& id, int64_t after_seq,
                              const std::function<void(const ftd::v1::JobEvent&)>& on_event,
                              const std::function<void(const std::string&)>& on_reconnect) {
  auto last_contact = std::chrono::steady_clock::now();
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    // Waiting for the channel to be ready makes a watch started while ftd restarts wait for it
    // (bounded below) instead of failing at once.
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() + opts_.reconnect_timeout);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (interrupted_) return absl::CancelledError("watch interrupted");
      active_ = &ctx;
    }
    ftd::v1::WatchJobRequest req;
    req.set_id(id);
    req.set_after_seq(after_seq);
    auto reader = stub_->WatchJob(&ctx, req);
    ftd::v1::JobEvent ev;
    bool got_result = false;
    while (reader->Read(&ev)) {
      last_contact = std::chrono::steady_clock::now();
      attempt = 0;
      after_seq = ev.seq();
      got_result |= ev.has_result();
      on_event(ev);
    }
    const grpc::Status st = reader->Finish();
    {
      std::lock_guard<std::mutex> l(mu_);
      active_ = nullptr;
      if (interrupted_) return absl::CancelledError("watch interrupted");
    }
    if (st.ok()) {
      if (got_result) return absl::OkStatus();
      // The stream ended without the result (should not happen): resume after the last event.
    } else if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
               st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
               st.error_code() != grpc::StatusCode::CANCELLED && st.error_code() != grpc::StatusCode::INTERNAL &&
               st.error_code() != grpc::StatusCode::UNKNOWN) {
      return FromGrpc(st);  // NOT_FOUND, INVALID_ARGUMENT, ...: retrying cannot help
    }
    if (std::chrono::steady_clock::now() - last_contact > opts_.reconnect_timeout) {
      return absl::UnavailableError(absl::StrCat("lost ftd at ", opts_.address, " for more than ",
                                                 opts_.reconnect_timeout.count() / 1000, " s (", st.error_message(),
                                                 "); the job goes on: watch it again with ftctl watch ", id));
    }
    if (on_reconnect) on_reconnect(st.ok() ? std::string("stream ended early") : st.error_message());
    std::this_thread::sleep_for(Backoff(attempt));
  }
}

}  // namespace ftd::client
