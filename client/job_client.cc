#include "client/job_client.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/tls_probe.h"
#include "proto/grpc_status.h"

namespace ftd::client {

using Clock = std::chrono::system_clock;

namespace {

bool Retryable(const grpc::Status& s) { return s.error_code() == grpc::StatusCode::UNAVAILABLE; }

std::chrono::milliseconds Backoff(int attempt) {
  return std::chrono::milliseconds(std::min(1000, 50 << std::min(attempt, 5)));
}

// A stream that ended this way may go on once ftd is back (a restart, a dropped connection).
bool ConnectionLost(const grpc::Status& st) {
  switch (st.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN: return true;
    default: return false;
  }
}

std::string Seconds(std::chrono::milliseconds d) { return absl::StrFormat("%.3g s", d.count() / 1000.0); }

constexpr char kTlsFailed[] =
    "the TLS handshake failed: something answers there, but check that ca_file is the CA that signed ftd's "
    "certificate, that the certificate is valid and that its subjectAltName names the host you connect to (a "
    "certificate for DNS:localhost does not cover 127.0.0.1), and that ftd listens with TLS (--tls-cert)";

// gRPC's reason for a failed connection, in a few words.
std::string ConnectFailure(const grpc::Status& probe, std::chrono::milliseconds waited) {
  const std::string& m = probe.error_message();
  if (absl::StrContains(m, "Connection refused")) return "connection refused (nothing listens there)";
  if (absl::StrContains(m, "No such file or directory")) return "no such socket";
  if (absl::StrContains(m, "Permission denied")) return "permission denied";
  if (absl::StrContains(m, "SSL") || absl::StrContains(m, "ssl") || absl::StrContains(m, "andshake") ||
      absl::StrContains(m, "certificate")) {
    return kTlsFailed;
  }
  if (absl::StrContains(m, "DNS resolution failed") || absl::StrContains(m, "not known") ||
      absl::StrContains(m, "Name or service")) {
    return "the host name does not resolve";
  }
  return absl::StrCat("no answer within ", Seconds(waited));
}

// Reads a PEM file named in the client's settings.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in || s.str().empty()) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " cannot be read"));
  return s.str();
}

// Whether a plain-text connection to `address` stays on this machine (a unix socket, loopback).
bool StaysLocal(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) return true;
  for (const char* p : {"127.", "localhost:", "[::1]:", "ipv4:127.", "ipv6:[::1]", "dns:///localhost:"}) {
    if (absl::StartsWith(address, p)) return true;
  }
  return false;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const ClientOptions& o) {
  if (!o.tls) {
    if (!o.token.empty() && !StaysLocal(o.address)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to send a token in clear to ", o.address, ": give the context a ca_file (TLS), or use ftd's unix "
          "socket on that machine"));
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions s;
  if (!o.ca_file.empty()) {
    auto ca = ReadPem(o.ca_file, "ca_file");
    if (!ca.ok()) return ca.status();
    s.pem_root_certs = *ca;
  }
  if (!o.cert_file.empty() || !o.key_file.empty()) {
    auto cert = ReadPem(o.cert_file, "cert_file");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(o.key_file, "key_file");
    if (!key.ok()) return key.status();
    s.pem_cert_chain = *cert;
    s.pem_private_key = *key;
  }
  return grpc::SslCredentials(s);
}

}  // namespace

JobClient::JobClient(ClientOptions opts) : opts_(std::move(opts)) {
  opts_.connect_timeout = std::min(opts_.connect_timeout, opts_.timeout);
  grpc::ChannelArguments args;
  // Reconnect quickly after a daemon restart instead of gRPC's default of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetMaxReceiveMessageSize(64 << 20);
  auto creds = ChannelCredentials(opts_);
  if (!creds.ok()) {
    setup_ = creds.status();
    creds = grpc::InsecureChannelCredentials();
  }
  channel_ = grpc::CreateCustomChannel(opts_.address, *creds, args);
  stub_ = ftd::v1::JobService::NewStub(channel_);
  admin_ = ftd::v1::AdminService::NewStub(channel_);
}

void JobClient::Prepare(grpc::ClientContext* ctx) const {
  if (!opts_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + opts_.token);
}

absl::Status JobClient::AwaitReconnect(std::optional<Clock::time_point>* lost_since, const std::string& why,
                                       const std::string& again,
                                       const std::function<void(ConnectionEvent, const std::string&)>& on_connection) {
  if (!lost_since->has_value()) return absl::OkStatus();
  if (!WaitConnected(**lost_since + opts_.timeout)) {
    if (interrupted_) return absl::CancelledError("interrupted");
    return absl::UnavailableError(absl::StrCat("lost ftd at ", opts_.address, " for more than ", Seconds(opts_.timeout),
                                               " (", why, "); ", again, " (--timeout sets how long to wait for ftd)"));
  }
  lost_since->reset();
  if (on_connection) on_connection(ConnectionEvent::kRestored, "");
  return absl::OkStatus();
}

bool JobClient::WaitConnected(Clock::time_point deadline) {
  // In slices, so that an interrupt ends the wait.
  while (!interrupted_) {
    const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    if (channel_->WaitForConnected(slice)) return true;
    if (slice >= deadline) return false;
  }
  return false;
}

absl::Status JobClient::Unreachable(const std::string& why, bool listening) const {
  // Where the handshake failed, a server listens: starting one is no advice.
  if (listening || why == kTlsFailed) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach ftd at ", opts_.address, " (", opts_.address_source, "): ", why));
  }
  const std::string hint = !opts_.start_hint.empty()
                               ? opts_.start_hint
                               : absl::StrCat("Check that ftd runs there, or give its address with --addr HOST:PORT or "
                                              "$FTD_ADDR; to start one: ftd --listen ", opts_.address, " &");
  return absl::UnavailableError(
      absl::StrCat("cannot reach ftd at ", opts_.address, " (", opts_.address_source, "): ", why, ". ", hint));
}

absl::Status JobClient::EnsureContact() {
  if (!setup_.ok()) return setup_;
  if (contacted_) return absl::OkStatus();
  const auto start = Clock::now();
  const auto deadline = start + opts_.connect_timeout;
  // Over TCP, the first failed attempt is looked into at once (ProbeTcp): a refused port or a TLS
  // mistake will not mend in the rest of the wait, and every retry would be one more failed
  // handshake in ftd's log. Anything else (a daemon still starting) is waited for as before.
  std::optional<ProbeResult> early;
  if (!absl::StartsWith(opts_.address, "unix")) {
    auto state = channel_->GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_TRANSIENT_FAILURE && Clock::now() < deadline &&
           !interrupted_) {
      channel_->WaitForStateChange(state, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
      state = channel_->GetState(true);
    }
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && !interrupted_) {
      early = ProbeTcp(opts_, std::min(opts_.timeout, std::chrono::milliseconds(2000)));
      if (!early->why.empty()) return Unreachable(early->why, early->listening);
    }
  }
  if (WaitConnected(deadline)) {
    contacted_ = true;
    return absl::OkStatus();
  }
  if (interrupted_) return absl::CancelledError("interrupted");
  // One quick call that does not wait for the connection asks gRPC why it failed.
  grpc::ClientContext ctx;
  Prepare(&ctx);
  ctx.set_deadline(Clock::now() + std::chrono::milliseconds(100));
  ftd::v1::GetJobRequest req;
  ftd::v1::Job job;
  const grpc::Status probe = stub_->GetJob(&ctx, req, &job);
  if (probe.error_code() != grpc::StatusCode::UNAVAILABLE &&
      probe.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    contacted_ = true;  // it answered after all (INVALID_ARGUMENT for the empty id)
    return absl::OkStatus();
  }
  // Over TCP, try the connection directly: it tells a refused port, and a TLS mistake (which gRPC
  // reports as no answer at all), from a daemon that is not there.
  const ProbeResult tcp = early.has_value() ? *early : ProbeTcp(opts_, std::min(opts_.timeout, std::chrono::milliseconds(2000)));
  if (!tcp.why.empty()) return Unreachable(tcp.why, tcp.listening);
  std::string why = ConnectFailure(probe, opts_.connect_timeout);
  if (tcp.listening) absl::StrAppend(&why, " (something accepts connections there but gave no gRPC answer: is it ftd?)");
  return Unreachable(why, tcp.listening);
}

template <typename Resp, typename Call>
absl::StatusOr<Resp> JobClient::Unary(Call&& call) {
  const auto deadline = Clock::now() + opts_.timeout;
  if (auto st = EnsureContact(); !st.ok()) return st;
  grpc::Status last;
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    ctx.set_deadline(deadline);
    // Contact was made: a connection lost since (a daemon restart) is waited for, up to the deadline.
    ctx.set_wait_for_ready(true);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (interrupted_) return absl::CancelledError("interrupted");
      active_ = &ctx;
    }
    Resp resp;
    last = call(&ctx, &resp);
    {
      std::lock_guard<std::mutex> l(mu_);
      active_ = nullptr;
      if (interrupted_) return absl::CancelledError("interrupted");
    }
    if (last.ok()) return resp;
    if (!Retryable(last)) break;
    const auto wake = Clock::now() + Backoff(attempt);
    if (wake >= deadline) break;
    std::this_thread::sleep_until(wake);
  }
  if (last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || last.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::Status(FromGrpc(last).code(),
                        absl::StrCat("no answer from ftd at ", opts_.address, " within ", Seconds(opts_.timeout), " (",
                                     last.error_message(), "); is it still running? (--timeout sets the limit)"));
  }
  if (last.error_code() == grpc::StatusCode::UNAUTHENTICATED && opts_.token.empty() && opts_.cert_file.empty() &&
      !opts_.local_hint.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(last.error_message(), "; ", opts_.local_hint));
  }
  return FromGrpc(last);
}

absl::StatusOr<ftd::v1::SubmitJobResponse> JobClient::Submit(const ftd::v1::SubmitJobRequest& req) {
  return Unary<ftd::v1::SubmitJobResponse>(
      [&](grpc::ClientContext* c, ftd::v1::SubmitJobResponse* r) { return stub_->SubmitJob(c, req, r); });
}

absl::StatusOr<ftd::v1::Job> JobClient::Get(const std::string& id, bool full) {
  ftd::v1::GetJobRequest req;
  req.set_id(id);
  req.set_full(full);
  return Unary<ftd::v1::Job>([&](grpc::ClientContext* c, ftd::v1::Job* r) { return stub_->GetJob(c, req, r); });
}

absl::StatusOr<ftd::v1::ListJobsResponse> JobClient::List(const ftd::v1::ListJobsRequest& req) {
  return Unary<ftd::v1::ListJobsResponse>(
      [&](grpc::ClientContext* c, ftd::v1::ListJobsResponse* r) { return stub_->ListJobs(c, req, r); });
}

absl::StatusOr<ftd::v1::Job> JobClient::Cancel(const std::string& id, bool checkpoint) {
  ftd::v1::CancelJobRequest req;
  req.set_id(id);
  req.set_checkpoint(checkpoint);
  return Unary<ftd::v1::Job>([&](grpc::ClientContext* c, ftd::v1::Job* r) { return stub_->CancelJob(c, req, r); });
}

absl::StatusOr<ftd::v1::Identity> JobClient::WhoAmI() {
  ftd::v1::WhoAmIRequest req;
  return Unary<ftd::v1::Identity>([&](grpc::ClientContext* c, ftd::v1::Identity* r) { return admin_->WhoAmI(c, req, r); });
}

absl::StatusOr<ftd::v1::CreateTokenResponse> JobClient::CreateToken(const ftd::v1::CreateTokenRequest& req) {
  return Unary<ftd::v1::CreateTokenResponse>(
      [&](grpc::ClientContext* c, ftd::v1::CreateTokenResponse* r) { return admin_->CreateToken(c, req, r); });
}

absl::StatusOr<ftd::v1::ListTokensResponse> JobClient::ListTokens(const ftd::v1::ListTokensRequest& req) {
  return Unary<ftd::v1::ListTokensResponse>(
      [&](grpc::ClientContext* c, ftd::v1::ListTokensResponse* r) { return admin_->ListTokens(c, req, r); });
}

absl::StatusOr<ftd::v1::Token> JobClient::RevokeToken(const std::string& id) {
  ftd::v1::RevokeTokenRequest req;
  req.set_id(id);
  return Unary<ftd::v1::Token>([&](grpc::ClientContext* c, ftd::v1::Token* r) { return admin_->RevokeToken(c, req, r); });
}

absl::StatusOr<ftd::v1::ListAuditResponse> JobClient::ListAudit(const ftd::v1::ListAuditRequest& req) {
  return Unary<ftd::v1::ListAuditResponse>(
      [&](grpc::ClientContext* c, ftd::v1::ListAuditResponse* r) { return admin_->ListAudit(c, req, r); });
}

absl::StatusOr<ftd::v1::DeleteJobResponse> JobClient::Delete(const std::string& id) {
  ftd::v1::DeleteJobRequest req;
  req.set_id(id);
  return Unary<ftd::v1::DeleteJobResponse>(
      [&](grpc::ClientContext* c, ftd::v1::DeleteJobResponse* r) { return stub_->DeleteJob(c, req, r); });
}

absl::StatusOr<ftd::v1::PruneJobsResponse> JobClient::Prune(const ftd::v1::PruneJobsRequest& req) {
  return Unary<ftd::v1::PruneJobsResponse>(
      [&](grpc::ClientContext* c, ftd::v1::PruneJobsResponse* r) { return stub_->PruneJobs(c, req, r); });
}

absl::StatusOr<ftd::v1::SubmitJobResponse> JobClient::Resubmit(const ftd::v1::ResubmitJobRequest& req) {
  return Unary<ftd::v1::SubmitJobResponse>(
      [&](grpc::ClientContext* c, ftd::v1::SubmitJobResponse* r) { return stub_->ResubmitJob(c, req, r); });
}

absl::StatusOr<ftd::v1::SchedulerState> JobClient::Scheduler(SchedulerAction action) {
  ftd::v1::SchedulerRequest req;
  return Unary<ftd::v1::SchedulerState>([&](grpc::ClientContext* c, ftd::v1::SchedulerState* r) {
    switch (action) {
      case SchedulerAction::kPause: return stub_->PauseScheduler(c, req, r);
      case SchedulerAction::kResume: return stub_->ResumeScheduler(c, req, r);
      case SchedulerAction::kGet: break;
    }
    return stub_->GetScheduler(c, req, r);
  });
}

absl::Status JobClient::Logs(const ftd::v1::GetLogsRequest& request,
                             const std::function<void(const std::string&)>& on_data,
                             const std::function<void(ConnectionEvent, const std::string&)>& on_connection) {
  if (auto st = EnsureContact(); !st.ok()) return st;
  ftd::v1::GetLogsRequest req = request;
  std::optional<Clock::time_point> lost_since;  // set while the connection is lost
  std::string lost_why;
  for (int attempt = 0;; ++attempt) {
    const std::string again = absl::StrCat("follow the log again with ftctl logs -f ", req.id());
    if (auto st = AwaitReconnect(&lost_since, lost_why, again, on_connection); !st.ok()) return st;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    if (!req.follow()) ctx.set_deadline(Clock::now() + std::max(opts_.timeout, std::chrono::milliseconds(600000)));
    {
      std::lock_guard<std::mutex> l(mu_);
      if (interrupted_) return absl::CancelledError("interrupted");
      active_ = &ctx;
    }
    auto reader = stub_->GetLogs(&ctx, req);
    ftd::v1::LogChunk chunk;
    while (reader->Read(&chunk)) {
      attempt = 0;
      // A resumed stream starts at the byte after the last one shown.
      req.set_offset(chunk.offset() + static_cast<int64_t>(chunk.data().size()));
      req.set_tail_bytes(0);
      req.set_tail_lines(0);
      on_data(chunk.data());
    }
    const grpc::Status st = reader->Finish();
    {
      std::lock_guard<std::mutex> l(mu_);
      active_ = nullptr;
      if (interrupted_) return absl::CancelledError("interrupted");
    }
    if (st.ok() || !req.follow() || !ConnectionLost(st)) return FromGrpc(st);
    lost_since = Clock::now();
    lost_why = st.error_message();
    if (on_connection) on_connection(ConnectionEvent::kLost, lost_why);
    std::this_thread::sleep_for(Backoff(attempt));
  }
}

absl::Status JobClient::DownloadTrace(const std::string& id, std::ostream& out, int64_t* bytes) {
  if (auto st = EnsureContact(); !st.ok()) return st;
  grpc::ClientContext ctx;
  Prepare(&ctx);
  // Big traces take a while; the deadline covers the whole transfer, generously.
  ctx.set_deadline(Clock::now() + std::max(opts_.timeout, std::chrono::milliseconds(600000)));
  {
    std::lock_guard<std::mutex> l(mu_);
    if (interrupted_) return absl::CancelledError("interrupted");
    active_ = &ctx;
  }
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
  const grpc::Status st = reader->Finish();
  {
    std::lock_guard<std::mutex> l(mu_);
    active_ = nullptr;
    if (interrupted_) return absl::CancelledError("interrupted");
  }
  if (!st.ok()) return FromGrpc(st);
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
                              const std::function<void(ConnectionEvent, const std::string&)>& on_connection) {
  if (auto st = EnsureContact(); !st.ok()) return st;
  std::optional<Clock::time_point> lost_since;  // set while the connection is lost
  std::string lost_why;
  for (int attempt = 0;; ++attempt) {
    // Reconnect first: the stream below then starts on a live connection, and a quiet job (no event
    // for a long time) is not mistaken for an unreachable daemon.
    const std::string again = absl::StrCat("the job goes on: watch it again with ftctl watch ", id);
    if (auto st = AwaitReconnect(&lost_since, lost_why, again, on_connection); !st.ok()) return st;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    ctx.set_wait_for_ready(true);
    // A long-lived stream, reopened now and then so that a connection that died silently is noticed.
    ctx.set_deadline(Clock::now() + opts_.stream_renewal);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (interrupted_) return absl::CancelledError("interrupted");
      active_ = &ctx;
    }
    ftd::v1::WatchJobRequest req;
    req.set_id(id);
    req.set_after_seq(after_seq);
    auto reader = stub_->WatchJob(&ctx, req);
    ftd::v1::JobEvent ev;
    bool got_result = false;
    while (reader->Read(&ev)) {
      attempt = 0;
      after_seq = ev.seq();
      got_result |= ev.has_result();
      on_event(ev);
    }
    const grpc::Status st = reader->Finish();
    {
      std::lock_guard<std::mutex> l(mu_);
      active_ = nullptr;
      if (interrupted_) return absl::CancelledError("interrupted");
    }
    if (st.ok() && got_result) return absl::OkStatus();
    if (st.ok() || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) continue;  // renewal: resume after the last event
    if (!ConnectionLost(st)) return FromGrpc(st);  // NOT_FOUND, INVALID_ARGUMENT, ...: retrying cannot help
    lost_since = Clock::now();
    lost_why = st.error_message();
    if (on_connection) on_connection(ConnectionEvent::kLost, lost_why);
    std::this_thread::sleep_for(Backoff(attempt));
  }
}

}  // namespace ftd::client
