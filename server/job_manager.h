// The job service's logic, without gRPC: validation of submissions, the queue (priority, then
// submission order), one worker per slot (each GPU, or one CPU slot), worker supervision and the
// classification of every exit, retries for infrastructure failures, cancel, and the event log
// clients watch. Handlers in service.cc translate to and from gRPC and call this class.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "ftd/v1/jobs.pb.h"
#include "ftd/v1/worker.pb.h"
#include "server/metrics.h"
#include "server/store.h"
#include "server/supervisor.h"

namespace ftd::server {

struct ManagerConfig {
  std::string data_dir;                 // jobs/<id>/{worker.log,checkpoints}
  std::string worker_binary;            // ftd-worker
  std::string worker_address;           // "unix:<data_dir>/worker.sock", given to workers
  int gpus = 0;                         // GPU slots; 0: one CPU slot
  int max_queued = 1000;                // RESOURCE_EXHAUSTED beyond
  int default_max_attempts = 3;
  int grace_ms = 10000;                 // SIGTERM -> SIGKILL on cancel
  int heartbeat_timeout_ms = 30000;     // no message from a worker for this long: lost
  int backoff_base_ms = 2000;           // retry n waits base * 2^(n-1), capped
  int backoff_max_ms = 60000;
  bool requeue_on_restart = true;       // policy for jobs found RUNNING at start (docs/api.md)
  bool paused = false;                  // accept and store jobs, start none (maintenance)
};

class JobManager {
 public:
  JobManager(ManagerConfig cfg, Store* store, Metrics* metrics);
  ~JobManager();

  // Recovers jobs left RUNNING by a previous daemon (per policy) and starts scheduling.
  absl::Status Start();
  // Stops taking work, asks running workers to stop (they checkpoint), requeues their jobs, and
  // waits for them until `deadline`; kills what is left.
  void Drain(std::chrono::steady_clock::time_point deadline);

  absl::StatusOr<ftd::v1::SubmitJobResponse> Submit(const ftd::v1::SubmitJobRequest& req);
  absl::StatusOr<ftd::v1::Job> Get(const std::string& id);
  absl::StatusOr<ftd::v1::ListJobsResponse> List(const ftd::v1::ListJobsRequest& req);
  absl::StatusOr<ftd::v1::Job> Cancel(const std::string& id);
  // Events after `after_seq`; waits up to `wait` for some when there are none yet. *done is set
  // once the job is terminal and every event has been returned.
  absl::StatusOr<std::vector<ftd::v1::JobEvent>> Events(const std::string& id, int64_t after_seq,
                                                        std::chrono::milliseconds wait, bool* done);

  // A PROFILE job's Chrome trace file, once written (NOT_FOUND before; FAILED_PRECONDITION for other kinds).
  absl::StatusOr<std::string> TracePath(const std::string& id);

  // Worker protocol.
  absl::StatusOr<ftd::v1::Assignment> Assign(const ftd::v1::WorkerHello& hello);
  // Returns whether the worker should stop.
  absl::StatusOr<bool> OnWorkerMessage(const ftd::v1::WorkerMessage& msg);

  int slots() const { return static_cast<int>(slots_.size()); }

 private:
  struct Running {
    std::string job_id, token, slot, kernel_set;
    int attempt = 0;
    pid_t pid = 0;
    std::chrono::steady_clock::time_point last_seen;
    int64_t started_ms = 0;
    bool has_result = false;
    ftd::v1::RunResult result;
    bool cancel = false, lost = false, drain = false;
    double energy_reported_j = 0;  // the worker's energy_total_j already added to the counter
    int64_t reported_step = 0;     // the job's step and tokens already counted in the metrics (a
    int64_t reported_tokens = 0;   // report covers log_every steps; a resumed attempt starts here)
  };
  std::string TracePathOf(const std::string& id) const;

  void Loop();
  void ScheduleLocked();
  absl::Status StartLocked(const ftd::v1::Job& job, const std::string& slot);
  void OnExit(pid_t pid, ExitStatus st);
  void Finish(const Running& r, ExitStatus st);
  void Notify();
  void RefreshStateGauges();
  absl::Status Annotate(ftd::v1::Job* job);

  ManagerConfig cfg_;
  Store* store_;
  Metrics* metrics_;
  std::vector<std::string> slots_;
  std::unique_ptr<Supervisor> supervisor_;

  std::mutex mu_;
  std::condition_variable cv_;          // scheduling loop
  std::map<std::string, Running> running_;  // by job id
  std::map<std::string, std::string> slot_owner_;  // slot -> job id
  bool stopping_ = false;
  bool draining_ = false;
  std::thread loop_;

  std::mutex ev_mu_;
  std::condition_variable ev_cv_;       // new events for watchers
  uint64_t ev_gen_ = 0;
};

int64_t NowMs();

}  // namespace ftd::server
