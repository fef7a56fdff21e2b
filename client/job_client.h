// ftctl's connection to ftd: every call has a deadline; calls that are safe to repeat are retried
// while ftd is unreachable (UNAVAILABLE) until that deadline; WatchJob reconnects and resumes after
// the last event it delivered, so a watcher misses and repeats nothing across a dropped connection or
// a daemon restart. No CLI or printing here.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "ftd/v1/jobs.grpc.pb.h"

namespace ftd::client {

struct ClientOptions {
  std::string address = "127.0.0.1:7070";
  std::chrono::milliseconds timeout{30000};            // per call, retries included
  std::chrono::milliseconds reconnect_timeout{300000};  // watch: give up after this long unreachable
};

class JobClient {
 public:
  explicit JobClient(ClientOptions opts);

  // SubmitJob is idempotent through request_id (the caller always sets one), so it is retried too.
  absl::StatusOr<ftd::v1::SubmitJobResponse> Submit(const ftd::v1::SubmitJobRequest& req);
  absl::StatusOr<ftd::v1::Job> Get(const std::string& id);
  absl::StatusOr<ftd::v1::ListJobsResponse> List(const ftd::v1::ListJobsRequest& req);
  absl::StatusOr<ftd::v1::Job> Cancel(const std::string& id);

  // Streams the job's events after `after_seq` to `on_event` until the final result has been
  // delivered (returns OK), the job does not exist (NOT_FOUND), the watch is interrupted (CANCELLED)
  // or ftd stays unreachable for reconnect_timeout. `on_reconnect` is told about each lost connection.
  absl::Status Watch(const std::string& id, int64_t after_seq,
                     const std::function<void(const ftd::v1::JobEvent&)>& on_event,
                     const std::function<void(const std::string&)>& on_reconnect);
  // Writes a PROFILE job's Chrome trace to `out` as it streams in; *bytes is what was written.
  absl::Status DownloadTrace(const std::string& id, std::ostream& out, int64_t* bytes);

  // Ends a Watch in progress from another thread (e.g. on Ctrl-C).
  void Interrupt();

 private:
  template <typename Resp, typename Call>
  absl::StatusOr<Resp> Unary(Call&& call);

  ClientOptions opts_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ftd::v1::JobService::Stub> stub_;
  std::mutex mu_;
  grpc::ClientContext* active_ = nullptr;  // the watch stream in flight
  std::atomic<bool> interrupted_{false};
};

// grpc::Status -> absl::Status (codes agree numerically); the message keeps ftd's own text.
absl::Status FromGrpc(const grpc::Status& s);

}  // namespace ftd::client
