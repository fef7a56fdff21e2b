// How many client connections ftd keeps open, so that idle connections cannot take its
// descriptors (an accepted connection is one descriptor for as long as it is open, and a daemon at
// its descriptor limit can neither accept its users nor start a worker):
//  - per peer: a local uid on the unix socket, an address over TCP (`per_peer`, and at most an
//    eighth of `total`; local admins, root and ftd's own user, are not held to it);
//  - in total (`total`), of which TCP peers together may hold three quarters, so that a flood from
//    many addresses still leaves local users room;
//  - `total` itself below the descriptor limit (RLIMIT_NOFILE) with room left for what else the
//    daemon opens (databases, listeners, gRPC's own descriptors, workers' pipes, logs and
//    connections, files streamed to clients): checked once at start (ConnectionBudget).
//
// Both listeners (UnixListener, TcpListener) accept connections themselves and ask Admit before
// they hand one to gRPC; a refused connection is closed at once, with a line in ftd's log (a few a
// minute). gRPC closes connections without telling: a connection is counted until its descriptor
// no longer names its socket, which Admit checks whenever a limit would refuse.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/common/clock.h"
#include "server/common/log.h"

namespace ftd::server {

struct ConnectionLimitsConfig {
  int total = 1024;    // client connections open at once, both listeners (0: no limit)
  int per_peer = 64;   // of one local uid, or one TCP address (0: no limit)
};

class ConnectionLimits {
 public:
  ConnectionLimits(ConnectionLimitsConfig cfg, const Clock* clock);

  // Whether the connection just accepted on `fd` may be served: OK, and it is counted until it is
  // closed; or RESOURCE_EXHAUSTED naming the limit and its flag (and the line is logged). `peer`:
  // "local uid 1002" or "ipv4:10.1.2.3" (no port); `local`: it came in on the unix socket;
  // `exempt`: not held to the per-peer limit (local admins).
  absl::Status Admit(int fd, const std::string& peer, bool local, bool exempt = false);

  // Open connections counted now (closed ones are found on the next sweep).
  int open() const;
  // TCP connections may hold this many of the total.
  int tcp_limit() const { return cfg_.total > 0 ? cfg_.total - cfg_.total / 4 : 0; }
  // One peer may hold this many (0: no limit).
  int per_peer_limit() const { return per_peer_; }

 private:
  struct Conn {
    ino_t inode = 0;
    std::string peer;
    bool local = false;
  };
  void ForgetLocked(std::map<int, Conn>::iterator it);
  void SweepLocked();  // forgets connections whose descriptor no longer names their socket
  absl::Status CheckLocked(const std::string& peer, bool local, bool exempt) const;

  ConnectionLimitsConfig cfg_;
  int per_peer_;
  RateLimitedLog refusals_;  // a few lines a minute per peer
  mutable std::mutex mu_;
  std::map<int, Conn> conns_;  // by descriptor
  std::map<std::string, int> open_by_peer_;
  int tcp_ = 0;
};

// The descriptors a daemon with `slots` job slots keeps for itself beside client connections, when
// `open_now` are open once it has started (listeners, databases, gRPC's own): per slot, a worker's
// start (a pipe, a pidfd), its log and its connection to ftd, per rank; and a margin for files
// streamed to clients and SQLite's passing needs.
int ReservedDescriptors(int open_now, int slots);

// The descriptors this process has open now.
int OpenDescriptors();

// --max-connections checked against the descriptor limit: `requested` (0: as many as fit, at most
// 4096) below `nofile` - ReservedDescriptors. INVALID_ARGUMENT naming the flag and the fix when it
// does not fit, or when fewer than 16 would.
absl::StatusOr<int> ConnectionBudget(int requested, uint64_t nofile, int open_now, int slots);

}  // namespace ftd::server
