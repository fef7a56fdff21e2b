#include "server/executors/local/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <grp.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ftd::server {
namespace {

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What the child of ForkExec reports through its close-on-exec pipe when a step before exec fails.
struct ChildFailure {
  int step = 0;  // index into kChildSteps
  int err = 0;   // errno
};
constexpr const char* kChildSteps[] = {"open /dev/null", "open the log", "setgroups", "setgid",
                                       "setuid", "exec", "give the log to the worker's user"};

// Whether `err` says that the daemon itself ran short (its descriptor table, the system's, memory
// for a pipe or a process): RESOURCE_EXHAUSTED, which the job manager does not count against the job.
bool DaemonShort(int err) { return err == EMFILE || err == ENFILE || err == ENOMEM || err == EAGAIN || err == ENOBUFS; }

absl::Status StartError(int err, std::string message) {
  return DaemonShort(err) ? absl::ResourceExhaustedError(std::move(message)) : absl::InternalError(std::move(message));
}

[[noreturn]] void ChildFail(int report_fd, int step) {
  const ChildFailure f{step, errno};
  (void)!::write(report_fd, &f, sizeof f);
  ::_exit(127);
}

// Between fork and exec the child of a multi-threaded daemon may only make async-signal-safe calls:
// everything it needs is built before the fork, and it only makes system calls.
[[noreturn]] void RunChild(int report_fd, const char* binary, char* const* argv, char* const* envp, const char* log_path,
                           pid_t process_group, const SpawnCredentials* cred) {
  auto fail = [report_fd](int step) { ChildFail(report_fd, step); };
  ::setpgid(0, process_group);
  const int in = ::open("/dev/null", O_RDONLY);
  if (in < 0) fail(0);
  // O_NOFOLLOW: the job directory may belong to the worker's user, who could plant a link there.
  const int out = ::open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0600);
  if (out < 0) fail(1);
  ::dup2(in, 0);
  ::dup2(out, 1);
  ::dup2(out, 2);
  if (in > 2) ::close(in);
  if (out > 2) ::close(out);
  if (cred != nullptr) {
    // The log is the job's, like the rest of its directory: its owner's to read.
    if (::fchown(1, cred->uid, cred->gid) != 0) fail(6);
    if (::setgroups(cred->groups.size(), cred->groups.data()) != 0) fail(2);
    if (::setgid(cred->gid) != 0) fail(3);
    if (::setuid(cred->uid) != 0) fail(4);
  }
  // The daemon ignores SIGPIPE and blocks its signals in every thread; a worker starts with neither.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(binary, argv, envp);
  ChildFail(report_fd, 5);
}

// Starts `binary` and returns once it has exec'd (or failed to), as posix_spawn would.
absl::StatusOr<pid_t> ForkExec(const std::string& binary, char* const* argv, char* const* envp,
                               const std::string& log_path, pid_t process_group,
                               const std::optional<SpawnCredentials>& cred) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    const int err = errno;
    return StartError(err, absl::StrCat("cannot start ", binary, ": pipe: ", std::strerror(err)));
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    RunChild(report[1], binary.c_str(), argv, envp, log_path.c_str(), process_group,
             cred.has_value() ? &*cred : nullptr);
  }
  const int fork_err = errno;
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    return StartError(fork_err, absl::StrCat("cannot start ", binary, ": fork: ", std::strerror(fork_err)));
  }
  ChildFailure f;
  ssize_t n;
  do {
    n = ::read(report[0], &f, sizeof f);
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == 0) return pid;  // the pipe closed on exec
  ::waitpid(pid, nullptr, 0);
  if (n != static_cast<ssize_t>(sizeof f)) return absl::InternalError(absl::StrCat("cannot start ", binary));
  if (f.step < 0 || f.step >= static_cast<int>(std::size(kChildSteps))) return absl::InternalError(absl::StrCat("cannot start ", binary));
  if (f.step == 5) return StartError(f.err, absl::StrCat("cannot start ", binary, ": ", std::strerror(f.err)));
  std::string what = kChildSteps[f.step];
  if (f.step == 1) what += " " + log_path;
  if ((f.step >= 2 && f.step <= 4) || f.step == 6) what += absl::StrCat(" to uid ", cred->uid, " gid ", cred->gid);
  // Only a descriptor the child could not open is the daemon's shortage (its table is the daemon's copy).
  const std::string message = absl::StrCat("cannot start ", binary, ": ", what, ": ", std::strerror(f.err));
  return f.step <= 1 ? StartError(f.err, message) : absl::InternalError(message);
}

}  // namespace

Supervisor::Supervisor(ExitCallback on_exit) : on_exit_(std::move(on_exit)) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  reaper_ = std::thread([this] { Reap(); });
}

Supervisor::~Supervisor() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  Wake();
  reaper_.join();
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [pid, fd] : live_) ::close(fd);
  ::close(wake_fd_);
}

void Supervisor::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

absl::StatusOr<pid_t> Supervisor::Spawn(const SpawnRequest& req) {
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("cannot create an eventfd: ", std::strerror(errno)));
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

  // A process group of its own (cancel signals the whole group), or the group of the job's rank 0.
  // That group cannot have been reused: its leader is our child and not reaped before its ranks are
  // started (ProcessLauncher holds its lock across the spawns and its exit handler takes it).
  auto pid = ForkExec(req.binary, argv.data(), envp.data(), req.log_path, req.process_group, req.credentials);
  if (!pid.ok()) return pid.status();
  // Nobody else reaps our children, so the pid still names this child here.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, *pid, 0));  // glibc 2.36's <sys/pidfd.h> lacks extern "C"
  if (fd < 0) {
    const int err = errno;
    ::kill(-*pid, SIGKILL);
    ::waitpid(*pid, nullptr, 0);
    return StartError(err, absl::StrCat("cannot watch the started ", req.binary,
                                        " (pidfd_open needs Linux 5.3 or newer): ", std::strerror(err)));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    live_[*pid] = fd;
  }
  Wake();
  return *pid;
}

void Supervisor::Stop(pid_t pid, int grace_ms, int sig) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (pid <= 0 || live_.count(pid) == 0) return;
    ::kill(-pid, sig);
    std::erase_if(kill_at_, [&](const auto& kv) { return kv.second == pid; });
    kill_at_.emplace(SteadyMs() + grace_ms, pid);
  }
  Wake();
}

void Supervisor::Postpone(pid_t pid, int grace_ms) {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t at = SteadyMs() + grace_ms;
  for (auto it = kill_at_.begin(); it != kill_at_.end(); ++it) {
    if (it->second != pid) continue;
    if (it->first < at) {
      kill_at_.erase(it);
      kill_at_.emplace(at, pid);
    }
    return;  // a later deadline needs no wake-up of the reaper
  }
}

void Supervisor::Kill(pid_t pid) {
  std::lock_guard<std::mutex> l(mu_);
  if (pid > 0 && live_.count(pid) != 0) ::kill(-pid, SIGKILL);
}

void Supervisor::Reap() {
  std::vector<pollfd> fds;
  std::vector<pid_t> pids;
  for (;;) {
    int timeout_ms = -1;
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    pids.assign(1, 0);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      const int64_t now = SteadyMs();
      while (!kill_at_.empty() && kill_at_.begin()->first <= now) {
        const pid_t pid = kill_at_.begin()->second;
        kill_at_.erase(kill_at_.begin());
        if (live_.count(pid) != 0) ::kill(-pid, SIGKILL);
      }
      if (!kill_at_.empty()) timeout_ms = static_cast<int>(kill_at_.begin()->first - now);
      for (const auto& [pid, fd] : live_) {
        fds.push_back(pollfd{fd, POLLIN, 0});
        pids.push_back(pid);
      }
    }
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (n <= 0) continue;
    if (fds[0].revents != 0) {
      uint64_t count;
      (void)!::read(wake_fd_, &count, sizeof count);
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const pid_t pid = pids[i];
      int status = 0;
      {
        std::lock_guard<std::mutex> l(mu_);
        // The worker is gone but not reaped: its pid, and so its group id, is still ours. Whatever it
        // left in its group goes with it. (A rank that joined another's group leads none: nothing is
        // signalled here, and ProcessLauncher decides about its group.)
        ::kill(-pid, SIGKILL);
        if (::waitpid(pid, &status, WNOHANG) != pid) continue;  // not exited after all (cannot happen)
        ::close(live_[pid]);
        live_.erase(pid);
        std::erase_if(kill_at_, [&](const auto& kv) { return kv.second == pid; });  // a new child may reuse it
      }
      ExitStatus st;
      if (WIFSIGNALED(status)) {
        st.signaled = true;
        st.signal = WTERMSIG(status);
      } else {
        st.code = WEXITSTATUS(status);
      }
      on_exit_(pid, st);
    }
  }
}

}  // namespace ftd::server
