#include "server/executors/local/worker_launcher.h"

#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/store/job_files.h"
#include "server/common/log.h"
#include "server/executors/local/supervisor.h"

namespace ftd::server {
namespace fs = std::filesystem;


ProcessLauncher::ProcessLauncher(ProcessLauncherConfig cfg)
    : cfg_(std::move(cfg)),
      supervisor_(std::make_unique<Supervisor>([this](pid_t pid, ExitStatus st) { OnExit(pid, st); })) {}

ProcessLauncher::~ProcessLauncher() { supervisor_.reset(); }  // joins the reaper before members go

void ProcessLauncher::SetExitHandler(ExitHandler handler) {
  std::lock_guard<std::mutex> l(mu_);
  handler_ = std::move(handler);
}

absl::StatusOr<int64_t> ProcessLauncher::Launch(const LaunchRequest& req) {
  const fs::path dir = fs::path(cfg_.jobs_dir) / req.job_id;
  std::error_code ec;
  fs::create_directories(dir, ec);
  SpawnRequest s;
  std::optional<WorkerUser> user = cfg_.user;
  if (cfg_.as_owner && req.owner_uid.has_value() && *req.owner_uid != 0) {
    auto owner = LookUpOwner(*req.owner_uid);
    if (!owner.ok()) return owner.status();
    user = *std::move(owner);
  }
  if (user.has_value()) {
    // Its directory is the worker's to write: checkpoints, trace, a resumed job's staged checkpoint.
    if (auto st = ChownTree(dir.string(), user->uid, user->gid); !st.ok()) return st;
    s.credentials = SpawnCredentials{user->uid, user->gid, user->groups};
    s.env = {{"HOME", user->home}, {"USER", user->name}, {"LOGNAME", user->name}};
  }
  s.binary = cfg_.worker_binary;
  s.args = {"agent", "--address", cfg_.worker_address, "--job", req.job_id, "--attempt", absl::StrCat(req.attempt)};
  // In the environment, not argv: /proc/PID/cmdline is readable by everyone (`ps`), environ only by
  // the process's owner.
  s.env.emplace_back(kAttemptTokenEnv, req.token);
  s.log_path = (dir / "worker.log").string();
  // Every GPU of the job, rank 0's first: rank r uses the r-th.
  if (req.gpu >= 0) {
    std::vector<int> gpus = {req.gpu};
    gpus.insert(gpus.end(), req.more_gpus.begin(), req.more_gpus.end());
    s.env.emplace_back("CUDA_VISIBLE_DEVICES", absl::StrJoin(gpus, ","));
  }
  s.env.emplace_back("FTD_SLOT", req.slot);
  // NVLink multicast off in every process ftd starts (docs/distributed.md).
  s.env.emplace_back("NCCL_NVLS_ENABLE", "0");
  s.env.emplace_back("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1");
  s.env.emplace_back("NVSHMEM_DISABLE_NVLS", "1");
  const std::string store = (dir / absl::StrCat("rendezvous-", req.attempt, ".store")).string();
  if (req.ranks > 1) fs::remove(store, ec);  // a new file per attempt (c10d's FileStore appends)
  // Held across the spawns so that an immediate exit is not reported before the pids are known.
  std::lock_guard<std::mutex> l(mu_);
  Running r;
  r.job_id = req.job_id;
  r.attempt = req.attempt;
  r.oom_kills = SystemOomKills();
  r.live_ranks = req.ranks;
  const std::string cgroup = absl::StrCat(req.job_id, "-", req.attempt);
  pid_t leader = 0;
  std::vector<pid_t> followers;
  for (int rank = 0; rank < req.ranks; ++rank) {
    SpawnRequest rs = s;
    if (req.ranks > 1) rs.args.insert(rs.args.end(), {"--rank", absl::StrCat(rank), "--store", store});
    rs.process_group = leader;  // rank 0: a group of its own; the others join it
    auto pid = supervisor_->Spawn(rs);
    if (!pid.ok()) {
      if (leader != 0) supervisor_->Kill(leader);  // its exit finds no attempt and is not reported
      return pid.status();
    }
    if (rank == 0) {
      leader = *pid;
    } else {
      followers.push_back(*pid);
    }
    // Moved right after exec, before the worker loads anything (posix_spawn returns once it has
    // exec'd); the ranks of a job share its cgroup and its limit.
    if (cfg_.cgroups != nullptr && (rank == 0 || !r.cgroup.empty())) {
      if (auto st = cfg_.cgroups->Place(cgroup, *pid); st.ok()) {
        r.cgroup = cgroup;
      } else {
        FtdLog() << "job " << req.job_id << " runs without a memory limit: " << st.message();
      }
    }
  }
  for (pid_t f : followers) followers_[f] = leader;
  attempts_[leader] = std::move(r);
  return static_cast<int64_t>(leader);
}

void ProcessLauncher::OnExit(pid_t reaped, ExitStatus rank_status) {
  // Under the lock: SetExitHandler(nullptr) returns only once no handler call is in flight.
  std::lock_guard<std::mutex> l(mu_);
  pid_t pid = reaped;  // the attempt's rank 0
  if (auto f = followers_.find(reaped); f != followers_.end()) {
    pid = f->second;
    followers_.erase(f);
  }
  auto it = attempts_.find(pid);
  if (it == attempts_.end()) return;
  Running& running = it->second;
  if (reaped == pid) {
    running.leader_gone = true;  // the reaper killed whatever was left in its group
    running.leader_status = rank_status;
  } else if ((rank_status.signaled || rank_status.code != 0) && !running.leader_gone && !running.first_failure) {
    // A rank failed while rank 0 ran: no rank is left behind, and the attempt ends as this rank did.
    running.first_failure = rank_status;
    supervisor_->Kill(pid);
  }
  if (--running.live_ranks > 0) return;  // reported once every rank is reaped
  ExitStatus st = running.first_failure.value_or(running.leader_status);
  const Running r = std::move(running);
  attempts_.erase(it);
  bool killed = false;
  {
    std::lock_guard<std::mutex> k(killed_mu_);
    killed = killed_.erase(pid) > 0;
  }
  if (!r.cgroup.empty()) {
    const CgroupMemory m = cfg_.cgroups->Release(r.cgroup);
    st.oom_killed = m.oom_kills > 0;
    st.memory_limit_bytes = m.limit_bytes;
    st.memory_peak_bytes = m.peak_bytes;
  } else if (st.signaled && st.signal == SIGKILL && !killed && r.oom_kills >= 0) {
    st.oom_killed = SystemOomKills() > r.oom_kills;  // a SIGKILL not ours, while the OOM killer was at work
  }
  if (handler_) handler_(r.job_id, r.attempt, st);
}

void ProcessLauncher::MarkKilled(int64_t pid) {
  std::lock_guard<std::mutex> l(killed_mu_);
  killed_.insert(static_cast<pid_t>(pid));
}

void ProcessLauncher::Stop(int64_t pid, std::chrono::milliseconds grace, StopMode mode) {
  MarkKilled(pid);
  supervisor_->Stop(static_cast<pid_t>(pid), static_cast<int>(grace.count()),
                    mode == StopMode::kCheckpoint ? SIGTERM : SIGUSR1);
}

void ProcessLauncher::Postpone(int64_t pid, std::chrono::milliseconds grace) {
  supervisor_->Postpone(static_cast<pid_t>(pid), static_cast<int>(grace.count()));
}

void ProcessLauncher::Kill(int64_t pid) {
  MarkKilled(pid);
  supervisor_->Kill(static_cast<pid_t>(pid));
}

void ProcessLauncher::KillOrphan(int64_t pid, const std::string& job_id) {
  if (pid <= 0) return;
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string cmd = ss.str();
  // The argv this launcher gives a worker: "... agent --address A --job <id> ...".
  const std::string agent("\0agent\0", 7), job = std::string("\0--job\0", 7) + job_id + '\0';
  if (cmd.find(agent) != std::string::npos && cmd.find(job) != std::string::npos) {
    ::kill(-static_cast<pid_t>(pid), SIGKILL);
  }
}

}  // namespace ftd::server
