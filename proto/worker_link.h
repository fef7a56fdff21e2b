// The worker's end of the worker protocol (proto/ftd/v1/worker.proto), shared by ftd-worker's agent
// and the test stand-in ftd-fake-worker: fetch the attempt's assignment, open the report stream,
// send messages (each carries the attempt's hello), beat on a thread of its own while the run goes
// on, and close the stream.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "ftd/v1/worker.grpc.pb.h"

namespace ftd {

class WorkerLink {
 public:
  // Asks the daemon at `address` ("unix:/path/worker.sock") for the attempt's assignment, waiting
  // up to 30 s for it to answer. The error names the job and the address.
  static absl::StatusOr<std::unique_ptr<WorkerLink>> Connect(const std::string& address, const std::string& job_id,
                                                             int attempt, const std::string& token);
  ~WorkerLink();  // Close()

  const ftd::v1::Assignment& assignment() const { return assignment_; }

  // Opens the report stream and sends `started`.
  void Open();
  // Sends `m` with the hello set; false when the stream is broken (the daemon went away). Thread-safe.
  bool Send(ftd::v1::WorkerMessage m);
  // Every `interval` until Close(), sends what `beat` returns, from a thread of its own.
  void StartHeartbeat(std::chrono::duration<double> interval, std::function<ftd::v1::WorkerMessage()> beat);
  // Stops the heartbeat and ends the stream. Idempotent.
  void Close();

 private:
  WorkerLink() = default;

  std::unique_ptr<ftd::v1::WorkerService::Stub> stub_;
  ftd::v1::WorkerHello hello_;
  ftd::v1::Assignment assignment_;
  grpc::ClientContext stream_ctx_;
  ftd::v1::WorkerAck ack_;
  std::unique_ptr<grpc::ClientWriter<ftd::v1::WorkerMessage>> writer_;
  std::mutex write_mu_;
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool closing_ = false;
  std::thread heartbeat_;
};

}  // namespace ftd
