// A Clock for tests, set and moved by hand: wall and steady time start at fixed values and advance
// together, so a test drives timeouts, deadlines and rate limits with no sleeps.
#pragma once

#include <cstdint>

#include "server/common/clock.h"

namespace ftd::server::testing {

class FakeClock final : public Clock {
 public:
  int64_t UnixMs() const override { return unix_ms; }
  int64_t SteadyMs() const override { return steady_ms; }
  void Advance(int64_t ms) {
    unix_ms += ms;
    steady_ms += ms;
  }
  int64_t unix_ms = 1'700'000'000'000;  // 2023-11-14, milliseconds since the epoch
  int64_t steady_ms = 5'000;
};

}  // namespace ftd::server::testing
