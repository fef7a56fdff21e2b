#include "server/policy/usage_ledger.h"

#include <algorithm>
#include <cmath>

namespace ftd::server {

namespace {

constexpr double kMsPerHour = 3600.0 * 1000.0;

double Overlap(const UsageInterval& u, int64_t from_ms, int64_t to_ms) {
  const int64_t a = std::max(u.start_ms, from_ms), b = std::min(u.end_ms, to_ms);
  return b > a ? u.gpus * static_cast<double>(b - a) / kMsPerHour : 0.0;
}

// The integral of gpus * 2^(-(now - t) / h) over the interval, in GPU-hours.
double DecayedOf(const UsageInterval& u, int64_t now_ms, int64_t half_life_ms) {
  const int64_t end = std::min(u.end_ms, now_ms);
  if (end <= u.start_ms) return 0.0;
  if (half_life_ms <= 0) return u.gpus * static_cast<double>(end - u.start_ms) / kMsPerHour;
  const double h = static_cast<double>(half_life_ms);
  const double w = std::exp2(-static_cast<double>(now_ms - end) / h) -
                   std::exp2(-static_cast<double>(now_ms - u.start_ms) / h);
  return u.gpus * h / std::log(2.0) * w / kMsPerHour;
}

}  // namespace

void UsageLedger::Add(const std::string& owner, const UsageInterval& ended) {
  if (ended.gpus <= 0 || ended.end_ms <= ended.start_ms) return;
  ended_[owner].push_back(ended);
}

void UsageLedger::Open(const std::string& job_id, const std::string& owner, double gpus, int64_t start_ms) {
  open_[job_id] = {owner, {gpus, start_ms, start_ms}};
}

UsageInterval UsageLedger::Close(const std::string& job_id, int64_t end_ms) {
  auto it = open_.find(job_id);
  if (it == open_.end()) return {};
  UsageInterval u = it->second.interval;
  u.end_ms = std::max(end_ms, u.start_ms);
  Add(it->second.owner, u);
  open_.erase(it);
  return u;
}

double UsageLedger::Sum(const std::string& owner, int64_t now_ms,
                        const std::function<double(const UsageInterval&)>& f) const {
  double sum = 0;
  if (auto it = ended_.find(owner); it != ended_.end()) {
    for (const auto& u : it->second) sum += f(u);
  }
  for (const auto& [id, o] : open_) {
    if (o.owner != owner) continue;
    UsageInterval u = o.interval;
    u.end_ms = now_ms;
    sum += f(u);
  }
  return sum;
}

double UsageLedger::GpuHours(const std::string& owner, int64_t from_ms, int64_t now_ms) const {
  return Sum(owner, now_ms, [&](const UsageInterval& u) { return Overlap(u, from_ms, now_ms); });
}

double UsageLedger::Decayed(const std::string& owner, int64_t now_ms, int64_t half_life_ms) const {
  return Sum(owner, now_ms, [&](const UsageInterval& u) { return DecayedOf(u, now_ms, half_life_ms); });
}

void UsageLedger::ForgetBefore(int64_t ms) {
  for (auto it = ended_.begin(); it != ended_.end();) {
    std::erase_if(it->second, [&](const UsageInterval& u) { return u.end_ms < ms; });
    it = it->second.empty() ? ended_.erase(it) : std::next(it);
  }
}

}  // namespace ftd::server
