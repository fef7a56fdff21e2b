// ftd's unix socket for local clients (UnixListener, auth.h): it accepts each connection itself,
// records the peer's credentials (SO_PEERCRED) under a descriptor number that names the connection
// for a long time, and hands the connection to gRPC, whose calls then name it as the peer "fd:N".
#include "server/auth/auth.h"

#include <fcntl.h>
#include <grpcpp/server_posix.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/common/log.h"

namespace ftd::server {

namespace {

constexpr int kFirstConnFd = 100;  // connection descriptors are numbered upward from here (see Adopt)

ino_t InodeOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return st.st_ino;
}

}  // namespace

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Listen(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat("--socket \"", path, "\" must be a path of 1 to ",
                                                   sizeof addr.sun_path - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  std::unique_ptr<UnixListener> l(new UnixListener());
  l->path_ = path;
  l->fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  // A socket file left by a daemon that died is replaced; one a live daemon answers on is not.
  if (int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); probe >= 0) {
    const bool live = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(probe);
    if (live) {
      return absl::AlreadyExistsError(absl::StrCat("another ftd listens on --socket ", path, " already"));
    }
  }
  ::unlink(path.c_str());
  // Any local user may connect (identity is the peer's uid): 0666, set after bind, so that the
  // socket is never more open than that (the umask may make it less open until then).
  if (::bind(l->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::chmod(path.c_str(), 0666) != 0 ||
      ::listen(l->fd_, 128) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on --socket ", path, ": ", strerror(errno)));
  }
  return l;
}

UnixListener::~UnixListener() {
  Stop();
  if (fd_ >= 0) ::close(fd_);
}

void UnixListener::Serve(grpc::Server* server, ConnectionLimits* limits, uid_t daemon_uid) {
  thread_ = std::thread([this, server, limits, daemon_uid] { Loop(server, limits, daemon_uid); });
}

void UnixListener::Stop() {
  if (stop_.exchange(true)) return;
  ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
  if (thread_.joinable()) thread_.join();
  ::unlink(path_.c_str());
}

// Moves an accepted descriptor to a number above every one handed out before (wrapping at the
// descriptor limit), so that "fd:N" names one connection for a long time, not the next one the
// kernel gives the lowest free number; the inode check in PeerOf covers the wrap.
int UnixListener::Adopt(int fd) {
  if (next_fd_ < kFirstConnFd) next_fd_ = kFirstConnFd;
  int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, next_fd_);
  if (moved < 0) moved = ::fcntl(fd, F_DUPFD_CLOEXEC, kFirstConnFd);
  if (moved < 0) return fd;
  ::close(fd);
  next_fd_ = moved + 1;
  return moved;
}

void UnixListener::Loop(grpc::Server* server, ConnectionLimits* limits, uid_t daemon_uid) {
  while (!stop_) {
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stop_) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      FtdLog() << "accept on " << path_ << ": " << strerror(errno);
      return;
    }
    Conn c;
    socklen_t len = sizeof c.cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len) != 0) {
      ::close(fd);
      continue;
    }
    fd = Adopt(fd);
    const bool admin = c.cred.uid == 0 || c.cred.uid == daemon_uid;
    const std::string peer = absl::StrCat("local user ", LocalUserName(c.cred.uid), " (uid ", c.cred.uid, ")");
    if (limits != nullptr && !limits->Admit(fd, peer, /*local=*/true, /*exempt=*/admin).ok()) {
      ::close(fd);
      continue;
    }
    c.inode = InodeOf(fd);
    {
      std::lock_guard<std::mutex> l(mu_);
      // Forget connections gRPC has closed since.
      for (auto it = conns_.begin(); it != conns_.end();) {
        it = InodeOf(it->first) == it->second.inode ? std::next(it) : conns_.erase(it);
      }
      conns_[fd] = c;
    }
    grpc::AddInsecureChannelFromFd(server, fd);
  }
}

std::optional<ucred> UnixListener::PeerOf(const std::string& grpc_peer) const {
  int fd = -1;
  if (!absl::StartsWith(grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer.substr(3), &fd)) return std::nullopt;
  std::lock_guard<std::mutex> l(mu_);
  auto it = conns_.find(fd);
  if (it == conns_.end() || InodeOf(fd) != it->second.inode) return std::nullopt;
  return it->second.cred;
}

}  // namespace ftd::server
