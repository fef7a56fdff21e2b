// ftctl's connection to ftd. No CLI or printing here.
//
// Every call is bounded by ClientOptions::timeout. Before the first contact with ftd, connecting is
// bounded by connect_timeout (about 2 s): with no daemon at the address a call fails at once with one
// line naming the address, what to check and how to start ftd. Once contact was made, calls ride
// through a lost connection (a daemon restart): unary calls, all safe to repeat (SubmitJob through its
// request id), are retried with backoff until their deadline, and WatchJob reconnects for up to
// `timeout` and resumes after the last event it delivered, so a watcher misses and repeats nothing.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ftd/v1/admin.grpc.pb.h"
#include "ftd/v1/jobs.grpc.pb.h"

namespace ftd::client {

struct ClientOptions {
  std::string address = "127.0.0.1:7070";  // a gRPC target: host:port, [v6]:port, unix:/path
  // Where the address came from ("--addr", "$FTD_ADDR", "the config file X", "the default"), for messages.
  std::string address_source = "the default";
  std::chrono::milliseconds timeout{30000};          // per unary call, retries included; watch: per reconnection
  std::chrono::milliseconds connect_timeout{2000};   // the first contact (at most `timeout`)
  std::chrono::milliseconds stream_renewal{300000};  // a quiet watch stream is reopened this often
  // Security (docs/security.md). TLS when `tls`: the server is checked against `ca_file` (PEM; empty:
  // the system's roots); `cert_file`/`key_file` present a client certificate (mutual TLS).
  bool tls = false;
  std::string ca_file, cert_file, key_file;
  // What the message of an unreachable daemon says to do ("start it again with ..."); empty: how to
  // start one at `address`.
  std::string start_hint;
  // Added to UNAUTHENTICATED over TCP when no credentials were sent: where this machine's unix socket
  // is, which needs none.
  std::string local_hint;
  // A bearer token, sent as "authorization: Bearer ..." on every call. Read from a file, never from
  // the command line (it would show in ps); never printed.
  std::string token;
};

// How a watch's connection goes, for the caller to tell the user.
enum class ConnectionEvent { kLost, kRestored };

class JobClient {
 public:
  explicit JobClient(ClientOptions opts);

  absl::StatusOr<ftd::v1::SubmitJobResponse> Submit(const ftd::v1::SubmitJobRequest& req);
  // full=false: another user's job comes as its public row (Job.public_only). full=true: the whole
  // job, or PERMISSION_DENIED naming its owner.
  absl::StatusOr<ftd::v1::Job> Get(const std::string& id, bool full = false);
  absl::StatusOr<ftd::v1::ListJobsResponse> List(const ftd::v1::ListJobsRequest& req);
  absl::StatusOr<ftd::v1::Job> Cancel(const std::string& id, bool checkpoint = false);
  absl::StatusOr<ftd::v1::DeleteJobResponse> Delete(const std::string& id);
  absl::StatusOr<ftd::v1::PruneJobsResponse> Prune(const ftd::v1::PruneJobsRequest& req);
  absl::StatusOr<ftd::v1::SubmitJobResponse> Resubmit(const ftd::v1::ResubmitJobRequest& req);
  enum class SchedulerAction { kGet, kPause, kResume };
  absl::StatusOr<ftd::v1::SchedulerState> Scheduler(SchedulerAction action);
  // Streams the job's log to `on_data`; with `follow`, until the job has ended (no deadline: Ctrl-C
  // ends it). A follow that loses ftd reconnects for up to `timeout` and goes on from the byte after
  // the last one received, so no line is lost or repeated; `on_connection` hears of each loss.
  absl::Status Logs(const ftd::v1::GetLogsRequest& req, const std::function<void(const std::string&)>& on_data,
                    const std::function<void(ConnectionEvent, const std::string& why)>& on_connection = {});

  // Streams the job's events after `after_seq` to `on_event` until the final result has been
  // delivered (returns OK), the job does not exist (NOT_FOUND), the watch is interrupted (CANCELLED)
  // or ftd stays unreachable for `timeout` (UNAVAILABLE). `on_connection` hears of each lost and
  // restored connection (`why`: gRPC's reason for a loss).
  absl::Status Watch(const std::string& id, int64_t after_seq,
                     const std::function<void(const ftd::v1::JobEvent&)>& on_event,
                     const std::function<void(ConnectionEvent, const std::string& why)>& on_connection);
  // Writes a PROFILE job's Chrome trace to `out` as it streams in; *bytes is what was written.
  absl::Status DownloadTrace(const std::string& id, std::ostream& out, int64_t* bytes);

  // ftd.v1.AdminService.
  absl::StatusOr<ftd::v1::Identity> WhoAmI();
  absl::StatusOr<ftd::v1::CreateTokenResponse> CreateToken(const ftd::v1::CreateTokenRequest& req);
  absl::StatusOr<ftd::v1::ListTokensResponse> ListTokens(const ftd::v1::ListTokensRequest& req);
  absl::StatusOr<ftd::v1::Token> RevokeToken(const std::string& id);
  absl::StatusOr<ftd::v1::ListAuditResponse> ListAudit(const ftd::v1::ListAuditRequest& req);

  // Ends a call in progress (a watch, a wait for ftd) from another thread, e.g. on Ctrl-C.
  void Interrupt();

  const ClientOptions& options() const { return opts_; }

 private:
  // OK once ftd was reached (at most connect_timeout on the first call); UNAVAILABLE saying how to fix it.
  absl::Status EnsureContact();
  // Waits for the channel to be connected until `deadline` (false: not connected, or interrupted).
  bool WaitConnected(std::chrono::system_clock::time_point deadline);
  // After a stream lost ftd at *lost_since (unset: it was not lost, OK at once): waits for it for up
  // to the timeout. OK (unsetting it, telling `on_connection` kRestored) once it is back; else
  // CANCELLED (interrupted) or UNAVAILABLE saying `why` and `again` (what to run to go on).
  absl::Status AwaitReconnect(std::optional<std::chrono::system_clock::time_point>* lost_since, const std::string& why,
                              const std::string& again,
                              const std::function<void(ConnectionEvent, const std::string&)>& on_connection);
  // UNAVAILABLE naming the address, `why`, and (unless something `listening` there failed the
  // handshake) how to start ftd.
  absl::Status Unreachable(const std::string& why, bool listening = false) const;
  template <typename Resp, typename Call>
  absl::StatusOr<Resp> Unary(Call&& call);
  // Adds the call credentials (the token) to a call's context.
  void Prepare(grpc::ClientContext* ctx) const;

  ClientOptions opts_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ftd::v1::JobService::Stub> stub_;
  std::unique_ptr<ftd::v1::AdminService::Stub> admin_;
  absl::Status setup_;  // a channel that could not be made (an unreadable CA file): every call returns it
  bool contacted_ = false;
  std::mutex mu_;
  grpc::ClientContext* active_ = nullptr;  // the call in flight that Interrupt cancels
  std::atomic<bool> interrupted_{false};
};

}  // namespace ftd::client
