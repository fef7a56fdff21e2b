#include "server/worker_launcher.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/supervisor.h"

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
  s.binary = cfg_.worker_binary;
  s.args = {"agent", "--address", cfg_.worker_address, "--job", req.job_id, "--attempt", absl::StrCat(req.attempt)};
  // In the environment, not argv: /proc/PID/cmdline is readable by everyone (`ps`), environ only by
  // the process's owner.
  s.env.emplace_back(kAttemptTokenEnv, req.token);
  s.log_path = (dir / "worker.log").string();
  if (req.gpu >= 0) s.env.emplace_back("CUDA_VISIBLE_DEVICES", std::to_string(req.gpu));
  s.env.emplace_back("FTD_SLOT", req.slot);
  // Held across the spawn so that an immediate exit is not reported before the pid is known.
  std::lock_guard<std::mutex> l(mu_);
  Running r{req.job_id, req.attempt, "", SystemOomKills()};
  auto pid = supervisor_->Spawn(s);
  if (!pid.ok()) return pid.status();
  // Moved right after exec, before the worker loads anything (posix_spawn returns once it has exec'd).
  if (cfg_.cgroups != nullptr) {
    const std::string name = absl::StrCat(req.job_id, "-", req.attempt);
    if (auto st = cfg_.cgroups->Place(name, *pid); st.ok()) {
      r.cgroup = name;
    } else {
      std::cerr << "ftd: job " << req.job_id << " runs without a memory limit: " << st.message() << std::endl;
    }
  }
  attempts_[*pid] = std::move(r);
  return static_cast<int64_t>(*pid);
}

void ProcessLauncher::OnExit(pid_t pid, ExitStatus st) {
  // Under the lock: SetExitHandler(nullptr) returns only once no handler call is in flight.
  std::lock_guard<std::mutex> l(mu_);
  auto it = attempts_.find(pid);
  if (it == attempts_.end()) return;
  const Running r = std::move(it->second);
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
