#include "server/auth/connection_limits.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ftd::server {

namespace {

ino_t SocketInode(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return st.st_ino;
}

constexpr int kPerSlotDescriptors = 8;  // a start's pipe and pidfd, the log, the worker's connection, spares
constexpr int kMarginDescriptors = 64;  // streamed log and trace files, SQLite's temporary files
constexpr int kMaxAutoConnections = 4096;
constexpr int kMinConnections = 16;

}  // namespace

ConnectionLimits::ConnectionLimits(ConnectionLimitsConfig cfg, const Clock* clock)
    : cfg_(cfg),
      per_peer_(cfg.total > 0 && cfg.per_peer > 0 ? std::min(cfg.per_peer, std::max(cfg.total / 8, 1)) : cfg.per_peer),
      refusals_("refused connections", 3, clock) {}

void ConnectionLimits::ForgetLocked(std::map<int, Conn>::iterator it) {
  if (auto p = open_by_peer_.find(it->second.peer); p != open_by_peer_.end() && --p->second <= 0) {
    open_by_peer_.erase(p);
  }
  if (!it->second.local) --tcp_;
  conns_.erase(it);
}

void ConnectionLimits::SweepLocked() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    auto next = std::next(it);
    if (SocketInode(it->first) != it->second.inode) ForgetLocked(it);
    it = next;
  }
}

absl::Status ConnectionLimits::CheckLocked(const std::string& peer, bool local, bool exempt) const {
  if (cfg_.total > 0 && static_cast<int>(conns_.size()) >= cfg_.total) {
    return absl::ResourceExhaustedError(absl::StrCat("ftd has ", conns_.size(), " connections open, its limit (",
                                                     "--max-connections ", cfg_.total, ")"));
  }
  if (!local && cfg_.total > 0 && tcp_ >= tcp_limit()) {
    return absl::ResourceExhaustedError(absl::StrCat("TCP peers hold ", tcp_, " connections, three quarters of ",
                                                     "--max-connections ", cfg_.total,
                                                     " (the rest is kept for local users)"));
  }
  if (!exempt && per_peer_ > 0) {
    auto it = open_by_peer_.find(peer);
    if (const int n = it == open_by_peer_.end() ? 0 : it->second; n >= per_peer_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          peer, " has ", n, " connections open, the limit per peer (",
          per_peer_ == cfg_.per_peer ? absl::StrCat("--max-connections-per-peer ", per_peer_)
                                     : absl::StrCat(per_peer_, ": an eighth of --max-connections ", cfg_.total),
          ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConnectionLimits::Admit(int fd, const std::string& peer, bool local, bool exempt) {
  absl::Status st;
  {
    std::lock_guard<std::mutex> l(mu_);
    // The kernel gives a closed connection's number to the next one: whatever it named is gone.
    if (auto it = conns_.find(fd); it != conns_.end()) ForgetLocked(it);
    st = CheckLocked(peer, local, exempt);
    if (!st.ok()) {
      SweepLocked();  // the counts may hold connections gRPC has closed since
      st = CheckLocked(peer, local, exempt);
    }
    if (st.ok()) {
      conns_[fd] = Conn{SocketInode(fd), peer, local};
      ++open_by_peer_[peer];
      if (!local) ++tcp_;
      return st;
    }
  }
  refusals_.Write(absl::StrCat("refused a connection from ", peer, ": ", st.message()), peer);
  return st;
}

int ConnectionLimits::open() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(conns_.size());
}

int OpenDescriptors() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return std::max(n - 1, 0);  // the iterator's own
}

int ReservedDescriptors(int open_now, int slots) {
  return open_now + kPerSlotDescriptors * std::max(slots, 1) + kMarginDescriptors;
}

absl::StatusOr<int> ConnectionBudget(int requested, uint64_t nofile, int open_now, int slots) {
  const int reserved = ReservedDescriptors(open_now, slots);
  const int64_t room = static_cast<int64_t>(std::min<uint64_t>(nofile, 1 << 30)) - reserved;
  const std::string why = absl::StrCat("the descriptor limit (RLIMIT_NOFILE ", nofile, ") less the ", reserved,
                                       " ftd keeps for itself and its ", slots, " slot(s)");
  const std::string fix = "raise the limit (ulimit -n, or LimitNOFILE= in the systemd unit)";
  if (requested < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max-connections must be >= 0 (got ", requested, ")"));
  }
  if (requested == 0) {
    if (room < kMinConnections) {
      return absl::InvalidArgumentError(absl::StrCat(why, " leaves room for ", std::max<int64_t>(room, 0),
                                                     " client connections, fewer than ", kMinConnections, ": ", fix));
    }
    return static_cast<int>(std::min<int64_t>(room, kMaxAutoConnections));
  }
  if (requested > room) {
    return absl::InvalidArgumentError(absl::StrCat("--max-connections ", requested, " does not fit ", why, " (",
                                                   std::max<int64_t>(room, 0), "): lower it, or ", fix));
  }
  return requested;
}

}  // namespace ftd::server
