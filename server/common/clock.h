// Time as the job manager sees it, behind an interface so tests drive it by hand: wall time for what
// is recorded (job and event timestamps, retry deadlines), a steady clock for timeouts (heartbeats).
#pragma once

#include <chrono>
#include <cstdint>

namespace ftd::server {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t UnixMs() const = 0;    // wall time, milliseconds since the epoch
  virtual int64_t SteadyMs() const = 0;  // monotonic milliseconds from an arbitrary start
};

class RealClock final : public Clock {
 public:
  int64_t UnixMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  int64_t SteadyMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace ftd::server
