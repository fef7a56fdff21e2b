// Per-user limits set by the admin (ftd --user-limits, --user-limit; docs/security.md) and the
// fair-share half-life. Parsed and validated once, at start.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace ftd::server {

struct UserLimits {
  int64_t max_queued = 0;   // queued jobs; 0: no limit (the daemon's --max-queued still holds)
  int64_t max_running = 0;  // jobs running at once; 0: no limit
  double gpu_hours = 0;     // GPU-hours per rolling window (QuotaConfig::window_ms); 0: no limit
  bool any() const { return max_queued > 0 || max_running > 0 || gpu_hours > 0; }
  std::string ToString() const;  // "queued=5,running=2,gpu-hours=10"
};

struct QuotaConfig {
  UserLimits defaults;                      // every user without a line of their own
  std::map<std::string, UserLimits> users;  // by user name
  int64_t window_ms = 24 * 3600'000LL;      // the GPU-hours window
  int64_t half_life_ms = 24 * 3600'000LL;   // fair share's decay; 0: fair share off (submission order)
  const UserLimits& For(const std::string& user) const;
};

// "queued=5,running=2,gpu-hours=10.5": any of the three, each at most once; "none": no limits.
absl::StatusOr<UserLimits> ParseUserLimits(const std::string& text);
// "alice:running=4,gpu-hours=100".
absl::StatusOr<std::pair<std::string, UserLimits>> ParseUserLimit(const std::string& text);

// "24 h", "90 min", "7 d": a window or half-life for messages.
std::string HoursText(int64_t ms);

}  // namespace ftd::server
