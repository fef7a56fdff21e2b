// GPU time by user, for quotas over a rolling window and for fair share's decayed usage. Holds the
// attempts that ended (loaded from the store at start, added as they end) and those running now
// (open: counted up to the time asked about). In GPU-hours: a job's GPUs (its share of a GPU when
// several jobs share one) times its attempt's wall time. Not thread-safe: the job manager locks it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ftd::server {

struct UsageInterval {
  double gpus = 0;       // GPUs held (a fraction when shared)
  int64_t start_ms = 0;  // unix ms
  int64_t end_ms = 0;    // unix ms; for an open interval, ignored (now)
};

class UsageLedger {
 public:
  void Add(const std::string& owner, const UsageInterval& ended);
  // A running attempt, counted until `Close` (keyed by job id).
  void Open(const std::string& job_id, const std::string& owner, double gpus, int64_t start_ms);
  // Ends the running attempt of `job_id` at `end_ms` and adds it; returns it (gpus 0 if none was open).
  UsageInterval Close(const std::string& job_id, int64_t end_ms);

  // GPU-hours used in [from_ms, now_ms].
  double GpuHours(const std::string& owner, int64_t from_ms, int64_t now_ms) const;
  // GPU-hours with each moment's use weighted by 2^(-age / half_life): Slurm's decayed usage.
  double Decayed(const std::string& owner, int64_t now_ms, int64_t half_life_ms) const;
  // Drops ended intervals that ended before `ms` (they no longer count in any window asked about).
  void ForgetBefore(int64_t ms);

 private:
  // f summed over the owner's intervals, running ones ending at now_ms.
  double Sum(const std::string& owner, int64_t now_ms, const std::function<double(const UsageInterval&)>& f) const;
  struct Open_ {
    std::string owner;
    UsageInterval interval;
  };
  std::map<std::string, std::vector<UsageInterval>> ended_;  // by owner
  std::map<std::string, Open_> open_;                        // by job id
};

}  // namespace ftd::server
