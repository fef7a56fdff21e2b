// The audit of calls refused for want of credentials, aggregated per peer so that a flood of them
// costs a few records a minute instead of one committed row per call (3,000 calls a second made
// half a megabyte a second of audit log, in the data directory, before this).
//
// The first such call from a peer (its address without the port) in a minute is recorded at once,
// as any audited call is; the rest of that minute's are counted, and when the minute is over one
// record says how many: "41 unauthenticated calls from ipv4:10.1.2.3 in the last minute
// (CancelJob 40, SubmitJob 1)". At most `max_peers` peers are tracked in a minute; calls from
// further peers are counted under "other peers". Plain class on an injected clock; CallAuth feeds
// it and runs its flush thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "server/auth/auth_store.h"
#include "server/common/clock.h"

namespace ftd::server {

class UnauthenticatedAudit {
 public:
  UnauthenticatedAudit(AuthStore* store, const Clock* clock, int64_t window_ms = 60'000, size_t max_peers = 64)
      : store_(store), clock_(clock), window_ms_(window_ms), max_peers_(max_peers) {}
  ~UnauthenticatedAudit();  // stops the thread and writes what is counted

  // One refused call: `peer` as gRPC names it ("ipv4:10.1.2.3:5123"), `action` the method's name,
  // `message` why it was refused.
  void Refused(const std::string& peer, const std::string& action, const std::string& message);
  // Writes the summaries of the minutes that are over (all of them with `all`).
  void Flush(bool all = false);
  // Flushes in a thread of its own as each minute ends, until destroyed.
  void Start();

  // The peer as one key: its address without the port ("ipv4:10.1.2.3", "ipv6:[::1]").
  static std::string PeerKey(const std::string& peer);

 private:
  struct Minute {
    int64_t start_ms = 0;
    int64_t counted = 0;                      // calls after the first, not yet recorded
    std::map<std::string, int64_t> actions;   // of those
    std::string message;                      // the last refusal's
  };
  void Write(const std::string& peer, const Minute& m);

  AuthStore* store_;
  const Clock* clock_;
  int64_t window_ms_;
  size_t max_peers_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<std::string, Minute> minutes_;  // by peer key
  std::thread thread_;
};

}  // namespace ftd::server
