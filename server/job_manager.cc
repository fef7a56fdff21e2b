#include "server/job_manager.h"

#include <signal.h>
#include <string.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/spec.h"

namespace ftd::server {
namespace fs = std::filesystem;
using ftd::v1::Job;
using ftd::v1::JobEvent;
using ftd::v1::RunResult;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

std::string RandomToken() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev == nullptr ? absl::StrCat(sig) : absl::StrCat(sig, " (SIG", abbrev, ")");
}

bool IsWorkerOf(pid_t pid, const std::string& job_id) {
  if (pid <= 0) return false;
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string cmd = ss.str();
  return cmd.find("ftd-worker") != std::string::npos && cmd.find(job_id) != std::string::npos;
}

}  // namespace

JobManager::JobManager(ManagerConfig cfg, Store* store, Metrics* metrics)
    : cfg_(std::move(cfg)), store_(store), metrics_(metrics) {
  if (cfg_.gpus > 0) {
    for (int i = 0; i < cfg_.gpus; ++i) slots_.push_back(absl::StrCat("gpu:", i));
  } else {
    slots_.push_back("cpu");
  }
  supervisor_ = std::make_unique<Supervisor>([this](pid_t pid, ExitStatus st) { OnExit(pid, st); });
}

JobManager::~JobManager() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

absl::Status JobManager::Start() {
  auto running = store_->JobsInStates({ftd::v1::RUNNING});
  if (!running.ok()) return running.status();
  for (const Job& j : *running) {
    if (IsWorkerOf(static_cast<pid_t>(j.worker_pid()), j.id())) Supervisor::Kill(static_cast<pid_t>(j.worker_pid()));
    const bool requeue = cfg_.requeue_on_restart && j.attempt() < j.max_attempts();
    auto st = store_->Update(
        j.id(),
        [&](Job& job, std::vector<JobEvent>& events) {
          job.set_worker_pid(0);
          job.set_reason("DAEMON_RESTART");
          if (requeue) {
            job.set_state(ftd::v1::QUEUED);
            job.set_message(absl::StrCat("ftd restarted while attempt ", job.attempt(), " of ", job.max_attempts(),
                                         " was running; requeued"));
          } else {
            job.set_state(ftd::v1::FAILED);
            job.set_finished_unix_ms(NowMs());
            job.set_message(absl::StrCat("ftd restarted while attempt ", job.attempt(), " of ", job.max_attempts(),
                                         " was running; no attempts left"));
            job.mutable_result()->set_outcome(RunResult::FAILED);
            job.mutable_result()->set_message(job.message());
          }
          JobEvent e;
          *e.mutable_state() = job;
          events.push_back(e);
          if (!requeue) {
            JobEvent r;
            *r.mutable_result() = job.result();
            events.push_back(r);
          }
          return absl::OkStatus();
        },
        NowMs());
    if (!st.ok()) return st.status();
    if (requeue) metrics_->Retry("DAEMON_RESTART");
  }
  RefreshStateGauges();
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void JobManager::Drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> l(mu_);
  draining_ = true;
  for (auto& [id, r] : running_) {
    r.drain = true;
    supervisor_->Stop(r.pid, std::max<int>(0, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  deadline - std::chrono::steady_clock::now())
                                                  .count())));
  }
  cv_.wait_until(l, deadline, [&] { return running_.empty(); });
  for (auto& [id, r] : running_) Supervisor::Kill(r.pid);
  cv_.wait_for(l, std::chrono::seconds(2), [&] { return running_.empty(); });
}

void JobManager::Notify() {
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> l(ev_mu_);
    ++ev_gen_;
  }
  ev_cv_.notify_all();
}

absl::StatusOr<ftd::v1::SubmitJobResponse> JobManager::Submit(const ftd::v1::SubmitJobRequest& req) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (draining_) return absl::UnavailableError("ftd is shutting down; submit again once it is back");
  }
  if (req.name().size() > 200) return absl::InvalidArgumentError("name must be at most 200 characters");
  if (req.request_id().size() > 128) return absl::InvalidArgumentError("request_id must be at most 128 characters");
  if (req.priority() < -1000 || req.priority() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("priority must be in [-1000, 1000] (got ", req.priority(), ")"));
  }
  if (req.max_attempts() < 0 || req.max_attempts() > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts must be in [1, 20], or 0 for the default (got ", req.max_attempts(), ")"));
  }
  auto config = ftd::spec::ToTrainConfig(req.spec());
  if (!config.ok()) return config.status();
  if (cfg_.gpus == 0 && config->device.rfind("cuda", 0) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.device is \"", config->device,
                                                   "\" but this ftd has no GPU (it runs jobs on its CPU slot): use "
                                                   "\"auto\" or \"cpu\""));
  }
  if (cfg_.gpus == 0 && config->Kernels().any()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.kernel_set: the job uses fused CUDA kernels (",
                                                   config->Kernels().ToString(),
                                                   ") but this ftd has no GPU; use kernel_set \"eager\""));
  }
  if (cfg_.gpus > 0 && config->device.rfind("cuda:", 0) == 0 && config->device != "cuda:0") {
    return absl::InvalidArgumentError(absl::StrCat("spec.device is \"", config->device,
                                                   "\": ftd assigns each job one GPU, which the job sees as "
                                                   "cuda:0; use \"auto\" or \"cuda\""));
  }
  Job job;
  job.set_name(req.name());
  job.set_kind(req.kind() == ftd::v1::JOB_KIND_UNSPECIFIED ? ftd::v1::FINETUNE : req.kind());
  job.set_owner(req.owner().empty() ? "unknown" : req.owner());
  job.set_priority(req.priority());
  job.set_state(ftd::v1::QUEUED);
  job.set_reason("WAITING_FOR_SLOT");
  job.set_max_attempts(req.max_attempts() == 0 ? cfg_.default_max_attempts : req.max_attempts());
  job.set_request_id(req.request_id());
  *job.mutable_spec() = req.spec();
  auto inserted = store_->Insert(job, NowMs(), cfg_.max_queued);  // the queue limit is checked in its transaction
  if (!inserted.ok()) return inserted.status();
  if (inserted->second) {
    metrics_->JobSubmitted(job.kind());
    Notify();
  }
  ftd::v1::SubmitJobResponse resp;
  *resp.mutable_job() = inserted->first;
  resp.set_created(inserted->second);
  if (auto st = Annotate(resp.mutable_job()); !st.ok()) return st;
  return resp;
}

absl::Status JobManager::Annotate(Job* job) {
  if (job->state() != ftd::v1::QUEUED) {
    job->set_queue_position(0);
    return absl::OkStatus();
  }
  auto queued = store_->JobsInStates({ftd::v1::QUEUED});
  if (!queued.ok()) return queued.status();
  int64_t pos = 0;
  for (const auto& q : *queued) {
    ++pos;
    if (q.id() == job->id()) break;
  }
  job->set_queue_position(pos);
  const int64_t now = NowMs();
  if (job->not_before_unix_ms() > now) {
    job->set_message(absl::StrCat(job->message(), absl::StrFormat(" (retry in %.1fs)",
                                                                  (job->not_before_unix_ms() - now) / 1000.0)));
    return absl::OkStatus();
  }
  size_t busy;
  {
    std::lock_guard<std::mutex> l(mu_);
    busy = slot_owner_.size();
  }
  job->set_reason(cfg_.paused ? "PAUSED" : "WAITING_FOR_SLOT");
  job->set_message(absl::StrCat(cfg_.paused ? "ftd is paused (--paused): no job starts; " : "", pos - 1, " job(s) ahead in the queue; ", busy, " of ", slots_.size(),
                                " slot(s) busy"));
  return absl::OkStatus();
}

absl::StatusOr<Job> JobManager::Get(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  if (auto st = Annotate(&*job); !st.ok()) return st;
  return job;
}

absl::StatusOr<ftd::v1::ListJobsResponse> JobManager::List(const ftd::v1::ListJobsRequest& req) {
  JobFilter f;
  for (int s : req.states()) f.states.push_back(static_cast<ftd::v1::JobState>(s));
  f.owner = req.owner();
  f.kind = req.kind();
  f.newest_first = req.newest_first();
  if (req.page_size() < 0 || req.page_size() > 500) {
    return absl::InvalidArgumentError(absl::StrCat("page_size must be in [1, 500], or 0 for 50 (got ", req.page_size(), ")"));
  }
  f.limit = req.page_size() == 0 ? 50 : req.page_size();
  if (!req.page_token().empty()) {
    try {
      size_t used = 0;
      f.after_seq = std::stoll(req.page_token(), &used);
      if (used != req.page_token().size() || f.after_seq < 0) throw std::invalid_argument("token");
    } catch (const std::exception&) {
      return absl::InvalidArgumentError("page_token is not one this ftd issued; pass next_page_token unchanged");
    }
  }
  int64_t next = 0;
  auto jobs = store_->List(f, &next);
  if (!jobs.ok()) return jobs.status();
  ftd::v1::ListJobsResponse resp;
  for (auto& j : *jobs) {
    if (auto st = Annotate(&j); !st.ok()) return st;
    *resp.add_jobs() = std::move(j);
  }
  if (next > 0) resp.set_next_page_token(absl::StrCat(next));
  return resp;
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& id) {
  std::unique_lock<std::mutex> l(mu_);
  auto it = running_.find(id);
  if (it != running_.end()) {
    it->second.cancel = true;
    supervisor_->Stop(it->second.pid, cfg_.grace_ms);
    l.unlock();
    auto job = store_->Update(
        id,
        [&](Job& job, std::vector<JobEvent>& events) {
          if (IsTerminal(job.state())) return absl::OkStatus();  // it ended meanwhile
          job.set_reason("CANCELLING");
          job.set_message(absl::StrCat("stopping the worker (SIGTERM, SIGKILL after ", cfg_.grace_ms / 1000.0, "s)"));
          JobEvent e;
          *e.mutable_state() = job;
          events.push_back(e);
          return absl::OkStatus();
        },
        NowMs());
    Notify();
    return job;
  }
  l.unlock();
  auto job = store_->Update(
      id,
      [&](Job& job, std::vector<JobEvent>& events) {
        if (IsTerminal(job.state())) {
          return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ", StateLabel(job.state()),
                                                            "; only queued or running jobs can be cancelled"));
        }
        if (job.state() == ftd::v1::RUNNING) {
          return absl::UnavailableError(absl::StrCat("job ", id, " is starting; try the cancel again"));
        }
        job.set_state(ftd::v1::CANCELLED);
        job.set_reason("CANCELLED");
        job.set_message("cancelled while queued");
        job.set_finished_unix_ms(NowMs());
        job.mutable_result()->set_outcome(RunResult::CANCELLED);
        job.mutable_result()->set_message(job.message());
        JobEvent e;
        *e.mutable_state() = job;
        events.push_back(e);
        JobEvent r;
        *r.mutable_result() = job.result();
        events.push_back(r);
        return absl::OkStatus();
      },
      NowMs());
  if (job.ok()) {
    metrics_->JobFinished(ftd::v1::CANCELLED, "CANCELLED", 0);
    RefreshStateGauges();
  }
  Notify();
  return job;
}

absl::StatusOr<std::vector<JobEvent>> JobManager::Events(const std::string& id, int64_t after_seq,
                                                         std::chrono::milliseconds wait, bool* done) {
  constexpr int kLimit = 500;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> l(ev_mu_);
    gen = ev_gen_;
  }
  for (int round = 0; round < 2; ++round) {
    auto job = store_->Get(id);  // state first: every event of a terminal job is already stored
    if (!job.ok()) return job.status();
    auto events = store_->Events(id, after_seq, kLimit);
    if (!events.ok()) return events.status();
    *done = IsTerminal(job->state()) && events->size() < static_cast<size_t>(kLimit);
    if (!events->empty() || *done || round == 1) return events;
    std::unique_lock<std::mutex> l(ev_mu_);
    ev_cv_.wait_for(l, wait, [&] { return ev_gen_ != gen; });
  }
  return std::vector<JobEvent>();
}

absl::StatusOr<ftd::v1::Assignment> JobManager::Assign(const ftd::v1::WorkerHello& hello) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = running_.find(hello.job_id());
    if (it == running_.end() || it->second.attempt != hello.attempt() || it->second.token != hello.token()) {
      return absl::PermissionDeniedError(absl::StrCat("attempt ", hello.attempt(), " of job ", hello.job_id(),
                                                      " is not the one ftd is running"));
    }
    it->second.last_seen = std::chrono::steady_clock::now();
  }
  auto job = store_->Get(hello.job_id());
  if (!job.ok()) return job.status();
  ftd::v1::Assignment a;
  a.set_job_id(job->id());
  a.set_name(job->name());
  *a.mutable_spec() = job->spec();
  a.set_checkpoint_dir((fs::path(cfg_.data_dir) / "jobs" / job->id() / "checkpoints").string());
  if (job->kind() == ftd::v1::PROFILE) {
    a.set_profile(true);
    a.set_trace_path(TracePathOf(job->id()));
  }
  return a;
}

std::string JobManager::TracePathOf(const std::string& id) const {
  return (fs::path(cfg_.data_dir) / "jobs" / id / "trace.json").string();
}

absl::StatusOr<std::string> JobManager::TracePath(const std::string& id) {
  auto job = store_->Get(id);
  if (!job.ok()) return job.status();
  if (job->kind() != ftd::v1::PROFILE) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is a ", ftd::v1::JobKind_Name(job->kind()),
                                                      " job; only PROFILE jobs have a trace (ftctl submit --kind profile)"));
  }
  const std::string path = TracePathOf(id);
  std::error_code ec;
  if (!job->has_profile() || !fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("job ", id, " has no trace yet (", ftd::v1::JobState_Name(job->state()),
                                            "); it is written once the profiled steps ran"));
  }
  return path;
}

absl::StatusOr<bool> JobManager::OnWorkerMessage(const ftd::v1::WorkerMessage& msg) {
  const auto& hello = msg.hello();
  std::string slot, kernel_set;
  double energy_delta_j = 0;
  int64_t steps_delta = 0, tokens_delta = 0;
  bool cancel;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = running_.find(hello.job_id());
    if (it == running_.end() || it->second.attempt != hello.attempt() || it->second.token != hello.token()) {
      return absl::PermissionDeniedError(absl::StrCat("attempt ", hello.attempt(), " of job ", hello.job_id(),
                                                      " is not the one ftd is running"));
    }
    Running& r = it->second;
    r.last_seen = std::chrono::steady_clock::now();
    if (msg.has_result()) {
      r.has_result = true;
      r.result = msg.result();
    }
    slot = r.slot;
    kernel_set = r.kernel_set;
    cancel = r.cancel || r.drain;
    if (msg.has_step()) {
      steps_delta = std::max<int64_t>(0, msg.step().step() - r.reported_step);
      tokens_delta = std::max<int64_t>(0, msg.step().tokens_total() - r.reported_tokens);
      r.reported_step = std::max(r.reported_step, msg.step().step());
      r.reported_tokens = std::max(r.reported_tokens, msg.step().tokens_total());
    }
    if (msg.has_step() && msg.step().nvml_available()) {
      energy_delta_j = std::max(0.0, msg.step().energy_total_j() - r.energy_reported_j);
      r.energy_reported_j = std::max(r.energy_reported_j, msg.step().energy_total_j());
    }
  }
  if (msg.has_step() || msg.has_log() || msg.has_profile()) {
    JobEvent e;
    if (msg.has_step()) {
      *e.mutable_step() = msg.step();
      metrics_->Step(slot, kernel_set, msg.step(), steps_delta, tokens_delta, energy_delta_j);
    } else if (msg.has_profile()) {
      *e.mutable_profile() = msg.profile();
      metrics_->Profile(kernel_set, msg.profile());
    } else {
      e.set_log(msg.log());
    }
    if (auto st = store_->AppendEvent(hello.job_id(), e, NowMs()); !st.ok()) return st;
    Notify();
  }
  return cancel;
}

void JobManager::Loop() {
  auto last_gauges = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    ScheduleLocked();
    const auto now = std::chrono::steady_clock::now();
    for (auto& [id, r] : running_) {
      if (!r.lost && now - r.last_seen > std::chrono::milliseconds(cfg_.heartbeat_timeout_ms)) {
        r.lost = true;
        Supervisor::Kill(r.pid);
      }
    }
    if (now - last_gauges > std::chrono::seconds(1)) {
      l.unlock();
      RefreshStateGauges();
      l.lock();
      last_gauges = now;
    }
    cv_.wait_for(l, std::chrono::milliseconds(100));
  }
}

void JobManager::ScheduleLocked() {
  if (cfg_.paused || draining_ || stopping_ || slot_owner_.size() == slots_.size()) return;
  auto queued = store_->JobsInStates({ftd::v1::QUEUED});
  if (!queued.ok()) return;
  const int64_t now = NowMs();
  for (const Job& job : *queued) {
    if (job.not_before_unix_ms() > now) continue;
    std::string free;
    for (const auto& s : slots_) {
      if (slot_owner_.count(s) == 0) {
        free = s;
        break;
      }
    }
    if (free.empty()) return;
    (void)StartLocked(job, free);
  }
}

absl::Status JobManager::StartLocked(const Job& queued, const std::string& slot) {
  const std::string token = RandomToken();
  const int64_t now = NowMs();
  auto job = store_->Update(
      queued.id(),
      [&](Job& job, std::vector<JobEvent>& events) {
        if (job.state() != ftd::v1::QUEUED) return absl::FailedPreconditionError("no longer queued");
        job.set_state(ftd::v1::RUNNING);
        job.set_attempt(job.attempt() + 1);
        job.set_slot(slot);
        job.set_started_unix_ms(now);
        job.set_reason("RUNNING");
        job.set_message(absl::StrCat("attempt ", job.attempt(), " of ", job.max_attempts(), " on ", slot));
        job.set_queue_position(0);
        JobEvent e;
        *e.mutable_state() = job;
        events.push_back(e);
        return absl::OkStatus();
      },
      now);
  if (!job.ok()) return job.status();
  metrics_->QueueWait((now - std::max(job->created_unix_ms(), job->not_before_unix_ms())) / 1000.0);
  const fs::path dir = fs::path(cfg_.data_dir) / "jobs" / job->id();
  std::error_code ec;
  fs::create_directories(dir, ec);
  SpawnRequest req;
  req.binary = cfg_.worker_binary;
  req.args = {"agent", "--address", cfg_.worker_address, "--job", job->id(), "--attempt", absl::StrCat(job->attempt()),
              "--token", token};
  req.log_path = (dir / "worker.log").string();
  if (slot.rfind("gpu:", 0) == 0) req.env.emplace_back("CUDA_VISIBLE_DEVICES", slot.substr(4));
  req.env.emplace_back("FTD_SLOT", slot);
  Running r;
  r.job_id = job->id();
  r.token = token;
  r.slot = slot;
  auto config = ftd::spec::ToTrainConfig(job->spec());
  r.kernel_set = config.ok() ? config->Kernels().Label() : "eager";
  r.attempt = job->attempt();
  r.reported_step = job->last_step().step();
  r.reported_tokens = job->last_step().tokens_total();
  r.last_seen = std::chrono::steady_clock::now();
  r.started_ms = now;
  auto pid = supervisor_->Spawn(req);
  if (!pid.ok()) {
    Finish(r, ExitStatus{false, 127, 0});
    return pid.status();
  }
  r.pid = *pid;
  running_[r.job_id] = r;
  slot_owner_[slot] = r.job_id;
  (void)store_->Update(
      r.job_id,
      [&](Job& j, std::vector<JobEvent>&) {
        j.set_worker_pid(*pid);
        return absl::OkStatus();
      },
      NowMs());
  Notify();
  return absl::OkStatus();
}

void JobManager::OnExit(pid_t pid, ExitStatus st) {
  Running r;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& kv) { return kv.second.pid == pid; });
    if (it == running_.end()) return;
    r = it->second;
    slot_owner_.erase(r.slot);
    running_.erase(it);
  }
  Finish(r, st);
  metrics_->SlotIdle(r.slot);
  RefreshStateGauges();
  Notify();
}

void JobManager::Finish(const Running& r, ExitStatus st) {
  using ftd::v1::JobState;
  JobState state = ftd::v1::FAILED;
  std::string reason, message;
  bool infra = false, requeue_free = false;
  const std::string exit_text =
      st.signaled ? absl::StrCat("killed by signal ", SignalName(st.signal)) : absl::StrCat("exit code ", st.code);
  if (r.drain) {
    state = ftd::v1::QUEUED;
    reason = "DAEMON_SHUTDOWN";
    message = absl::StrCat("ftd shut down while attempt ", r.attempt, " ran (worker ", exit_text, "); requeued");
    requeue_free = true;
  } else if (r.cancel) {
    state = ftd::v1::CANCELLED;
    reason = "CANCELLED";
    message = absl::StrCat("cancelled on request; worker stopped (", exit_text, ")");
  } else if (r.has_result && r.result.outcome() == RunResult::SUCCEEDED && !st.signaled && st.code == 0) {
    state = ftd::v1::SUCCEEDED;
    reason = "SUCCEEDED";
    message = r.result.message();
  } else if (r.has_result && r.result.outcome() == RunResult::OUT_OF_MEMORY) {
    reason = "GPU_OUT_OF_MEMORY";
    message = r.result.message();
  } else if (r.has_result && r.result.outcome() == RunResult::INVALID_SPEC) {
    reason = "INVALID_SPEC";
    message = r.result.message();
  } else if (r.has_result && r.result.outcome() == RunResult::NON_FINITE) {
    reason = "NON_FINITE";
    message = r.result.message();
  } else if (r.has_result && r.result.outcome() == RunResult::FAILED) {
    reason = "WORKER_ERROR";
    message = absl::StrCat(r.result.message(), " (worker ", exit_text, ")");
  } else if (r.lost) {
    reason = "LOST_HEARTBEAT";
    message = absl::StrCat("no message from the worker for ", cfg_.heartbeat_timeout_ms / 1000.0,
                           "s; its process group was killed");
    infra = true;
  } else if (st.signaled) {
    reason = "KILLED_BY_SIGNAL";
    message = absl::StrCat("worker ", exit_text);
    infra = true;
  } else if (st.code == 127 && r.pid == 0) {
    reason = "SPAWN_FAILED";
    message = absl::StrCat("could not start ", cfg_.worker_binary);
    infra = true;
  } else {
    reason = "WORKER_EXIT";
    message = absl::StrCat("worker ended with ", exit_text, " before reporting a result");
    infra = true;
  }
  const int64_t now = NowMs();
  bool retried = false;
  auto job = store_->Update(
      r.job_id,
      [&](Job& job, std::vector<JobEvent>& events) {
        job.set_worker_pid(0);
        job.set_reason(reason);
        if (infra && job.attempt() < job.max_attempts()) {
          const int64_t backoff =
              std::min<int64_t>(cfg_.backoff_max_ms, static_cast<int64_t>(cfg_.backoff_base_ms) << (job.attempt() - 1));
          job.set_state(ftd::v1::QUEUED);
          job.set_not_before_unix_ms(now + backoff);
          job.set_message(absl::StrCat("attempt ", job.attempt(), " of ", job.max_attempts(), " failed: ", message,
                                       "; retrying"));
          retried = true;
        } else if (requeue_free) {
          job.set_state(ftd::v1::QUEUED);
          job.set_max_attempts(job.max_attempts() + 1);  // a shutdown is not the job's failure
          job.set_message(message);
        } else {
          job.set_state(state);
          job.set_finished_unix_ms(now);
          job.set_message(infra ? absl::StrCat(message, " (attempt ", job.attempt(), " of ", job.max_attempts(),
                                               "; no retries left)")
                                : message);
          RunResult res = r.has_result ? r.result : RunResult();
          if (!r.has_result || state == ftd::v1::CANCELLED) {
            res.set_outcome(state == ftd::v1::CANCELLED ? RunResult::CANCELLED : RunResult::FAILED);
            res.set_message(job.message());
          }
          *job.mutable_result() = res;
        }
        JobEvent e;
        *e.mutable_state() = job;
        events.push_back(e);
        if (IsTerminal(job.state())) {
          JobEvent rr;
          *rr.mutable_result() = job.result();
          events.push_back(rr);
        }
        return absl::OkStatus();
      },
      now);
  if (!job.ok()) return;
  if (retried) metrics_->Retry(reason);
  if (IsTerminal(job->state())) metrics_->JobFinished(job->state(), reason, (now - r.started_ms) / 1000.0);
}

void JobManager::RefreshStateGauges() {
  std::map<ftd::v1::JobState, int64_t> counts;
  for (auto s : {ftd::v1::QUEUED, ftd::v1::RUNNING, ftd::v1::SUCCEEDED, ftd::v1::FAILED, ftd::v1::CANCELLED}) {
    auto n = store_->CountInState(s);
    if (n.ok()) counts[s] = *n;
  }
  metrics_->JobsByState(counts);
}

}  // namespace ftd::server
