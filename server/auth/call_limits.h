// Limits on how hard one client may drive the daemon: a request rate (a token bucket: a sustained
// rate and a burst) and a number of concurrent streaming calls (WatchJob, GetLogs, GetTrace), each
// per user and per connection, so that one teammate's script cannot starve the others' calls or hold
// every handler thread. Over a limit a call is RESOURCE_EXHAUSTED naming the limit, its value and
// the flag that sets it. Admins have no call rate limit (they run the daemon and its benchmarks),
// and a higher stream limit of their own (docs/security.md).
//
// Plain class on an injected clock; CallAuth applies it to each call after authentication
// (handler.h), keyed by the caller's user name and gRPC's peer ("ipv4:10.1.2.3:5123", "fd:112").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "server/common/clock.h"

namespace ftd::server {

struct CallLimitsConfig {
  double user_rate = 100;        // calls per second a user may sustain (0: no limit)
  double user_burst = 200;       // calls a user may make at once (ftd: twice the rate)
  double connection_rate = 50;   // calls per second one connection may sustain (0: no limit)
  double connection_burst = 100;
  int user_streams = 64;        // concurrent streaming calls of one user (0: no limit)
  int connection_streams = 32;  // concurrent streaming calls on one connection
  int admin_streams = 1024;     // concurrent streaming calls of one admin (0: no limit)
};

// Streams and memory: each open stream runs on a thread of its own (gRPC's synchronous server), and
// what those threads allocated goes back to glibc's per-thread arenas when they end, where it stays:
// after 2,000 admin watch streams closed, 62 MB of the 108 MB they took was still resident, and
// malloc_trim(0) gave back all but 9 MB. So when the streams open fall to a quarter of a peak of at
// least 256, and when none are left after a peak of at least 64, the limiter returns free heap
// memory to the system (`trim`): a call or two per peak, each a few milliseconds.
class CallLimiter {
 public:
  // `trim` returns free heap memory to the system (default: malloc_trim(0)).
  CallLimiter(CallLimitsConfig cfg, const Clock* clock, std::function<void()> trim = nullptr);

  // A streaming call's place, given back when the lease is destroyed (empty for a unary call).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease();

   private:
    friend class CallLimiter;
    CallLimiter* limiter_ = nullptr;  // null: nothing held
    std::string user_, connection_;
  };

  // Counts one call of `user` on `connection` against the limits: RESOURCE_EXHAUSTED saying which
  // limit when over one (the call is then not counted), else a lease to hold while a stream runs.
  // An `admin`'s call counts against the admin stream limit only.
  absl::StatusOr<Lease> Admit(const std::string& user, const std::string& connection, bool stream,
                              bool admin = false);

  // Users and connections with state kept (idle ones are forgotten): for tests.
  size_t tracked() const;

 private:
  struct Bucket {
    double tokens = 0;
    int64_t at_ms = 0;
    int streams = 0;
  };
  bool Take(Bucket* b, double rate, double burst, int64_t now);
  void Release(const std::string& user, const std::string& connection);
  void ForgetIdle(int64_t now);

  CallLimitsConfig cfg_;
  const Clock* clock_;
  mutable std::mutex mu_;
  std::map<std::string, Bucket> users_, connections_;
  std::function<void()> trim_;
  int open_streams_ = 0, peak_streams_ = 0;  // every user's, and the most since the last trim
  int64_t swept_ms_ = 0;
};

}  // namespace ftd::server
