// Thin gRPC handlers over JobManager: translate the request, call the manager, translate back
// (errors through the one map in proto/grpc_status.h). Each public handler runs for the caller the
// auth interceptor established (server/auth.h, through Authed in handler.h) and asks
// server/authz.h whether it may act.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "absl/status/status.h"
#include "ftd/v1/jobs.grpc.pb.h"
#include "ftd/v1/worker.grpc.pb.h"
#include "server/auth.h"
#include "server/job_manager.h"

namespace ftd::server {

// SubmitJob takes the request's bytes and parses them itself, so that a string field holding
// invalid UTF-8 is refused with INVALID_ARGUMENT naming the field (gRPC's own parse would answer a
// bare INTERNAL); the other methods are plain synchronous handlers.
class JobServiceImpl final
    : public ftd::v1::JobService::WithRawCallbackMethod_SubmitJob<ftd::v1::JobService::Service> {
 public:
  // `priority_cap`: the highest priority a non-admin may submit with.
  JobServiceImpl(JobManager* m, const std::atomic<bool>* stopping, const CallAuth* auth, int priority_cap)
      : m_(m), stopping_(stopping), auth_(auth), priority_cap_(priority_cap) {}
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext*, const grpc::ByteBuffer*,
                                      grpc::ByteBuffer*) override;
  grpc::Status GetJob(grpc::ServerContext*, const ftd::v1::GetJobRequest*, ftd::v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const ftd::v1::ListJobsRequest*, ftd::v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const ftd::v1::CancelJobRequest*, ftd::v1::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const ftd::v1::WatchJobRequest*,
                        grpc::ServerWriter<ftd::v1::JobEvent>*) override;
  grpc::Status GetTrace(grpc::ServerContext*, const ftd::v1::GetTraceRequest*,
                        grpc::ServerWriter<ftd::v1::TraceChunk>*) override;
  grpc::Status DeleteJob(grpc::ServerContext*, const ftd::v1::DeleteJobRequest*, ftd::v1::DeleteJobResponse*) override;
  grpc::Status PruneJobs(grpc::ServerContext*, const ftd::v1::PruneJobsRequest*, ftd::v1::PruneJobsResponse*) override;
  grpc::Status ResubmitJob(grpc::ServerContext*, const ftd::v1::ResubmitJobRequest*,
                           ftd::v1::SubmitJobResponse*) override;
  grpc::Status GetLogs(grpc::ServerContext*, const ftd::v1::GetLogsRequest*,
                       grpc::ServerWriter<ftd::v1::LogChunk>*) override;
  grpc::Status PauseScheduler(grpc::ServerContext*, const ftd::v1::SchedulerRequest*, ftd::v1::SchedulerState*) override;
  grpc::Status ResumeScheduler(grpc::ServerContext*, const ftd::v1::SchedulerRequest*,
                               ftd::v1::SchedulerState*) override;
  grpc::Status GetScheduler(grpc::ServerContext*, const ftd::v1::SchedulerRequest*, ftd::v1::SchedulerState*) override;

 private:
  grpc::Status Submit(const Identity& who, const ftd::v1::SubmitJobRequest& req, ftd::v1::SubmitJobResponse* resp);
  JobManager* m_;
  const std::atomic<bool>* stopping_;
  const CallAuth* auth_;
  int priority_cap_;
};

class WorkerServiceImpl final : public ftd::v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(JobManager* m) : m_(m) {}
  grpc::Status GetAssignment(grpc::ServerContext*, const ftd::v1::WorkerHello*, ftd::v1::Assignment*) override;
  grpc::Status Stream(grpc::ServerContext*, grpc::ServerReader<ftd::v1::WorkerMessage>*, ftd::v1::WorkerAck*) override;

 private:
  JobManager* m_;
};

}  // namespace ftd::server
