// Thin gRPC handlers over JobManager: translate the request, call the manager, translate back
// (errors through the one map in proto/grpc_status.h). Each public handler runs for the caller the
// auth interceptor established (server/auth/auth.h, through Authed in handler.h) and asks
// server/auth/authz.h whether it may act.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "absl/status/status.h"
#include "ftd/v1/jobs.grpc.pb.h"
#include "ftd/v1/worker.grpc.pb.h"
#include "server/auth/auth.h"
#include "server/jobs/job_manager.h"
#include "server/api/parsed_service.h"

namespace ftd::server {

// Synchronous handlers, registered through ParsedService (a request that does not parse, such as a
// string field holding invalid UTF-8, is INVALID_ARGUMENT naming the field).
class JobServiceImpl final : public ParsedService {
 public:
  // `priority_cap`: the highest priority a non-admin may submit with.
  JobServiceImpl(JobManager* m, const std::atomic<bool>* stopping, const CallAuth* auth, int priority_cap);
  grpc::Status SubmitJob(grpc::ServerContext*, const ftd::v1::SubmitJobRequest*, ftd::v1::SubmitJobResponse*);
  grpc::Status GetJob(grpc::ServerContext*, const ftd::v1::GetJobRequest*, ftd::v1::Job*);
  grpc::Status ListJobs(grpc::ServerContext*, const ftd::v1::ListJobsRequest*, ftd::v1::ListJobsResponse*);
  grpc::Status CancelJob(grpc::ServerContext*, const ftd::v1::CancelJobRequest*, ftd::v1::Job*);
  grpc::Status WatchJob(grpc::ServerContext*, const ftd::v1::WatchJobRequest*,
                        grpc::ServerWriter<ftd::v1::JobEvent>*);
  grpc::Status GetTrace(grpc::ServerContext*, const ftd::v1::GetTraceRequest*,
                        grpc::ServerWriter<ftd::v1::TraceChunk>*);
  grpc::Status DeleteJob(grpc::ServerContext*, const ftd::v1::DeleteJobRequest*, ftd::v1::DeleteJobResponse*);
  grpc::Status PruneJobs(grpc::ServerContext*, const ftd::v1::PruneJobsRequest*, ftd::v1::PruneJobsResponse*);
  grpc::Status ResubmitJob(grpc::ServerContext*, const ftd::v1::ResubmitJobRequest*,
                           ftd::v1::SubmitJobResponse*);
  grpc::Status GetLogs(grpc::ServerContext*, const ftd::v1::GetLogsRequest*,
                       grpc::ServerWriter<ftd::v1::LogChunk>*);
  grpc::Status PauseScheduler(grpc::ServerContext*, const ftd::v1::SchedulerRequest*, ftd::v1::SchedulerState*);
  grpc::Status ResumeScheduler(grpc::ServerContext*, const ftd::v1::SchedulerRequest*,
                               ftd::v1::SchedulerState*);
  grpc::Status GetScheduler(grpc::ServerContext*, const ftd::v1::SchedulerRequest*, ftd::v1::SchedulerState*);

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
