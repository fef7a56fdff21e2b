#include "proto/worker_link.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace ftd {

absl::StatusOr<std::unique_ptr<WorkerLink>> WorkerLink::Connect(const std::string& address, const std::string& job_id,
                                                                int attempt, const std::string& token) {
  std::unique_ptr<WorkerLink> link(new WorkerLink());
  link->stub_ = ftd::v1::WorkerService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  link->hello_.set_job_id(job_id);
  link->hello_.set_attempt(attempt);
  link->hello_.set_token(token);
  link->hello_.set_pid(::getpid());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.set_wait_for_ready(true);
  const grpc::Status st = link->stub_->GetAssignment(&ctx, link->hello_, &link->assignment_);
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot get the assignment of ", job_id, " from ", address, ": ", st.error_message()));
  }
  return link;
}

WorkerLink::~WorkerLink() { Close(); }

void WorkerLink::Open() {
  writer_ = stub_->Stream(&stream_ctx_, &ack_);
  ftd::v1::WorkerMessage started;
  started.set_started(true);
  Send(started);
}

bool WorkerLink::Send(ftd::v1::WorkerMessage m) {
  std::lock_guard<std::mutex> l(write_mu_);
  if (writer_ == nullptr) return false;
  *m.mutable_hello() = hello_;
  return writer_->Write(m);
}

void WorkerLink::StartHeartbeat(std::chrono::duration<double> interval, std::function<ftd::v1::WorkerMessage()> beat) {
  heartbeat_ = std::thread([this, interval, beat = std::move(beat)] {
    std::unique_lock<std::mutex> l(beat_mu_);
    while (!beat_cv_.wait_for(l, interval, [this] { return closing_; })) Send(beat());
  });
}

void WorkerLink::Close() {
  {
    std::lock_guard<std::mutex> l(beat_mu_);
    closing_ = true;
  }
  beat_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  std::lock_guard<std::mutex> l(write_mu_);
  if (writer_ == nullptr) return;
  writer_->WritesDone();
  (void)writer_->Finish();
  writer_.reset();
}

}  // namespace ftd
