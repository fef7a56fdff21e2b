#include "server/api/tcp_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/common/log.h"

namespace ftd::server {

namespace {

// `host_port` as (host, port): "[::1]:7070" -> ("::1", "7070"); "" host for ":7070".
absl::StatusOr<std::pair<std::string, std::string>> Split(std::string s) {
  for (const char* scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(s, scheme)) s = s.substr(std::strlen(scheme));
  }
  std::string host, port;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return absl::InvalidArgumentError("");
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos) return absl::InvalidArgumentError("");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  int n = 0;
  if (!absl::SimpleAtoi(port, &n) || n < 0 || n > 65535) return absl::InvalidArgumentError("");
  return std::make_pair(host, port);
}

int BoundPort(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return 0;
}

}  // namespace

std::string PeerAddress(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf, sizeof buf);
    return absl::StrCat("ipv4:", buf);
  }
  if (a.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr, buf, sizeof buf);
    return absl::StrCat("ipv6:[", buf, "]");
  }
  return "";
}

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host_port) {
  auto hp = Split(host_port);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen ", host_port, " is not HOST:PORT (127.0.0.1:7070, "
                                                   "[::1]:7070, 0.0.0.0:7070)"));
  }
  auto [host, port] = *hp;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--listen ", host_port, ": ", ::gai_strerror(rc)));
  }
  std::unique_ptr<TcpListener> l(new TcpListener());
  std::string error;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    // Port 0: the port the first address got, for the others too.
    if (l->port_ != 0) {
      if (ai->ai_family == AF_INET) reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = htons(l->port_);
      if (ai->ai_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_port = htons(l->port_);
    }
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    l->port_ = BoundPort(fd);
    l->fds_.push_back(fd);
  }
  ::freeaddrinfo(found);
  if (l->fds_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on --listen ", host_port, ": ",
                                                      error.empty() ? "no address to bind" : error));
  }
  if (::pipe2(l->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("cannot listen on --listen ", host_port, ": pipe: ", std::strerror(errno)));
  }
  return l;
}

TcpListener::~TcpListener() {
  Stop();
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

void TcpListener::Serve(grpc::experimental::ExternalConnectionAcceptor* acceptor, ConnectionLimits* limits) {
  acceptor_ = acceptor;
  limits_ = limits;
  thread_ = std::thread([this] { Loop(); });
}

void TcpListener::Stop() {
  if (stop_.exchange(true)) return;
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

void TcpListener::Loop() {
  std::vector<pollfd> polled;
  for (int fd : fds_) polled.push_back({fd, POLLIN, 0});
  polled.push_back({wake_[0], POLLIN, 0});
  while (!stop_) {
    if (::poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      FtdLog() << "poll on the TCP listener: " << std::strerror(errno);
      return;
    }
    for (size_t i = 0; i + 1 < polled.size() && !stop_; ++i) {
      if (polled[i].revents == 0) continue;
      // Every connection waiting on this socket, then back to poll.
      for (;;) {
        const int fd = ::accept4(polled[i].fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            // Out of descriptors despite the limits (something else holds them): the connection waits
            // in the backlog; poll again shortly rather than spin.
            ::poll(nullptr, 0, 100);
          }
          break;  // EAGAIN: none left; EINTR, ECONNABORTED: try on the next round
        }
        const std::string peer = PeerAddress(fd);
        if (!limits_->Admit(fd, peer, /*local=*/false).ok()) {
          ::close(fd);
          continue;
        }
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
        p.listener_fd = polled[i].fd;
        p.fd = fd;
        acceptor_->HandleNewConnection(&p);  // gRPC owns the descriptor from here on
      }
    }
  }
}

}  // namespace ftd::server
