#include "server/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ftd::server {
namespace {

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Supervisor::Supervisor(ExitCallback on_exit) : on_exit_(std::move(on_exit)) {
  reaper_ = std::thread([this] { Reap(); });
  killer_ = std::thread([this] {
    std::unique_lock<std::mutex> l(mu_);
    while (!stopping_) {
      if (kill_at_.empty()) {
        cv_.wait(l);
        continue;
      }
      const int64_t now = SteadyMs();
      auto it = kill_at_.begin();
      if (it->first > now) {
        cv_.wait_for(l, std::chrono::milliseconds(it->first - now));
        continue;
      }
      const pid_t pid = it->second;
      kill_at_.erase(it);
      if (live_.count(pid) != 0) ::kill(-pid, SIGKILL);
    }
  });
}

Supervisor::~Supervisor() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  killer_.join();
  reaper_.detach();  // blocked in waitpid, or waiting for children: ends with the process
}

absl::StatusOr<pid_t> Supervisor::Spawn(const SpawnRequest& req) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    bool overridden = false;
    for (const auto& [k, v] : req.env) overridden |= kv.rfind(k + "=", 0) == 0;
    if (!overridden) env_strings.push_back(std::move(kv));
  }
  for (const auto& [k, v] : req.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = req.args;
  args.insert(args.begin(), req.binary);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, req.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_setpgroup(&attr, 0);  // a process group of its own: cancel signals the whole group
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);  // the daemon blocks signals in its threads; workers must not
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  int rc;
  {
    std::lock_guard<std::mutex> l(mu_);
    rc = posix_spawn(&pid, req.binary.c_str(), &fa, &attr, argv.data(), envp.data());
    if (rc == 0) live_[pid] = true;
  }
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", req.binary, ": ", std::strerror(rc)));
  cv_.notify_all();
  return pid;
}

void Supervisor::Stop(pid_t pid, int grace_ms) {
  ::kill(-pid, SIGTERM);
  {
    std::lock_guard<std::mutex> l(mu_);
    kill_at_.emplace(SteadyMs() + grace_ms, pid);
  }
  cv_.notify_all();
}

void Supervisor::Kill(pid_t pid) { ::kill(-pid, SIGKILL); }

size_t Supervisor::running() const {
  std::lock_guard<std::mutex> l(mu_);
  return live_.size();
}

void Supervisor::Reap() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return !live_.empty() || stopping_; });
      if (stopping_) return;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    ExitStatus st;
    if (WIFSIGNALED(status)) {
      st.signaled = true;
      st.signal = WTERMSIG(status);
    } else if (WIFEXITED(status)) {
      st.code = WEXITSTATUS(status);
    } else {
      continue;  // stopped/continued
    }
    // Whatever the worker left in its group goes with it.
    ::kill(-pid, SIGKILL);
    {
      std::lock_guard<std::mutex> l(mu_);
      live_.erase(pid);
    }
    on_exit_(pid, st);
  }
}

}  // namespace ftd::server
