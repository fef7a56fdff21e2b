#include "server/auth/call_limits.h"

#include <malloc.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ftd::server {

namespace {
constexpr int kTrimPeak = 256;     // streams: a peak worth trimming after once a quarter is left
constexpr int kTrimLastPeak = 64;  // and one worth trimming after once none is
}  // namespace

CallLimiter::CallLimiter(CallLimitsConfig cfg, const Clock* clock, std::function<void()> trim)
    : cfg_(cfg), clock_(clock), trim_(trim ? std::move(trim) : [] { ::malloc_trim(0); }) {}

CallLimiter::Lease& CallLimiter::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (limiter_ != nullptr) limiter_->Release(user_, connection_);
    limiter_ = std::exchange(o.limiter_, nullptr);
    user_ = std::move(o.user_);
    connection_ = std::move(o.connection_);
  }
  return *this;
}

CallLimiter::Lease::~Lease() {
  if (limiter_ != nullptr) limiter_->Release(user_, connection_);
}

bool CallLimiter::Take(Bucket* b, double rate, double burst, int64_t now) {
  if (rate <= 0) return true;
  if (b->at_ms == 0) b->tokens = burst;  // a new bucket starts full
  b->tokens = std::min(burst, b->tokens + rate * static_cast<double>(now - b->at_ms) / 1000.0);
  b->at_ms = now;
  if (b->tokens < 1) return false;
  b->tokens -= 1;
  return true;
}

absl::StatusOr<CallLimiter::Lease> CallLimiter::Admit(const std::string& user, const std::string& connection,
                                                      bool stream, bool admin) {
  const int64_t now = std::max<int64_t>(clock_->SteadyMs(), 1);
  std::lock_guard<std::mutex> l(mu_);
  ForgetIdle(now);
  if (admin) {
    // No rate: admins run the daemon and its benchmarks. Their streams still hold a thread each.
    if (!stream) return Lease();
    Bucket& a = users_[user];
    if (cfg_.admin_streams > 0 && a.streams >= cfg_.admin_streams) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "admin ", user, " has ", a.streams, " streaming calls open (watch, logs, trace), the most an admin may "
          "(--max-streams-per-admin ", cfg_.admin_streams, "); close some first"));
    }
    ++a.streams;
    ++connections_[connection].streams;
    peak_streams_ = std::max(peak_streams_, ++open_streams_);
    Lease lease;
    lease.limiter_ = this;
    lease.user_ = user;
    lease.connection_ = connection;
    return lease;
  }
  Bucket& u = users_[user];
  Bucket& c = connections_[connection];
  if (stream && cfg_.user_streams > 0 && u.streams >= cfg_.user_streams) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "user ", user, " has ", u.streams, " streaming calls open (watch, logs, trace), the most a user may "
        "(--max-streams-per-user ", cfg_.user_streams, "); close one, or follow fewer jobs at once"));
  }
  if (stream && cfg_.connection_streams > 0 && c.streams >= cfg_.connection_streams) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this connection has ", c.streams, " streaming calls open, the most one connection may "
        "(--max-streams-per-connection ", cfg_.connection_streams, "); close one first"));
  }
  // Both buckets are checked before either is drawn on, so a refused call costs nothing.
  Bucket u_after = u, c_after = c;
  if (!Take(&u_after, cfg_.user_rate, cfg_.user_burst, now)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "user ", user, " is over the call rate limit of ", cfg_.user_rate, " calls per second (bursts of ",
        cfg_.user_burst, "; --max-calls-per-s-per-user); retry after a short pause"));
  }
  if (!Take(&c_after, cfg_.connection_rate, cfg_.connection_burst, now)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this connection is over the call rate limit of ", cfg_.connection_rate, " calls per second (bursts of ",
        cfg_.connection_burst, "; --max-calls-per-s-per-connection); retry after a short pause"));
  }
  u = u_after;
  c = c_after;
  Lease lease;
  if (stream) {
    ++u.streams;
    ++c.streams;
    peak_streams_ = std::max(peak_streams_, ++open_streams_);
    lease.limiter_ = this;
    lease.user_ = user;
    lease.connection_ = connection;
  }
  return lease;
}

void CallLimiter::Release(const std::string& user, const std::string& connection) {
  bool trim = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = users_.find(user); it != users_.end()) --it->second.streams;
    if (auto it = connections_.find(connection); it != connections_.end()) --it->second.streams;
    --open_streams_;
    if ((peak_streams_ >= kTrimPeak && open_streams_ <= peak_streams_ / 4) ||
        (peak_streams_ >= kTrimLastPeak && open_streams_ == 0)) {
      trim = true;
      peak_streams_ = open_streams_;  // the next trim waits for a new peak, or for a quarter of this one
    }
  }
  if (trim) trim_();
}

// Once a second at most: drops entries with no stream open whose bucket has refilled (the state of a
// forgotten entry and a new one is the same), so that closed connections do not accumulate.
void CallLimiter::ForgetIdle(int64_t now) {
  if (now - swept_ms_ < 1000) return;
  swept_ms_ = now;
  const auto sweep = [&](std::map<std::string, Bucket>& m, double rate, double burst) {
    for (auto it = m.begin(); it != m.end();) {
      const Bucket& b = it->second;
      const bool full = rate <= 0 || b.tokens + rate * static_cast<double>(now - b.at_ms) / 1000.0 >= burst;
      it = b.streams == 0 && full ? m.erase(it) : std::next(it);
    }
  };
  sweep(users_, cfg_.user_rate, cfg_.user_burst);
  sweep(connections_, cfg_.connection_rate, cfg_.connection_burst);
}

size_t CallLimiter::tracked() const {
  std::lock_guard<std::mutex> l(mu_);
  return users_.size() + connections_.size();
}

}  // namespace ftd::server
