#include "server/auth/unauthenticated_audit.h"

#include <chrono>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/log.h"

namespace ftd::server {

namespace {
constexpr char kOtherPeers[] = "other peers";
}  // namespace

UnauthenticatedAudit::~UnauthenticatedAudit() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Flush(true);
}

std::string UnauthenticatedAudit::PeerKey(const std::string& peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return peer;
  const size_t colon = peer.rfind(':');
  if (colon <= 4) return peer;
  if (absl::StartsWith(peer, "ipv6:") && peer[colon - 1] != ']') return peer;  // no port
  return peer.substr(0, colon);
}

void UnauthenticatedAudit::Refused(const std::string& peer, const std::string& action, const std::string& message) {
  const int64_t now = clock_->SteadyMs();
  std::string key = PeerKey(peer);
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = minutes_.find(key);
    if (it != minutes_.end() && now - it->second.start_ms >= window_ms_) {
      // Its minute is over: the flush thread has not got to it yet.
      if (it->second.counted > 0) Write(it->first, it->second);
      minutes_.erase(it);
      it = minutes_.end();
    }
    if (it == minutes_.end() && minutes_.size() >= max_peers_ && key != kOtherPeers) {
      key = kOtherPeers;
      it = minutes_.find(key);
    }
    if (it != minutes_.end()) {
      Minute& m = it->second;
      ++m.counted;
      ++m.actions[action];
      m.message = message;
      return;
    }
    Minute m;
    m.start_ms = now;
    minutes_.emplace(key, m);
  }
  cv_.notify_all();
  // The first of its minute: recorded as it comes.
  ftd::v1::AuditRecord r;
  r.set_unix_ms(clock_->UnixMs());
  r.set_peer(peer);
  r.set_action(action);
  r.set_code("UNAUTHENTICATED");
  r.set_message(message.substr(0, 500));
  if (auto st = store_->Audit(std::move(r)); !st.ok()) FtdLog() << "audit log: " << st.message();
}

void UnauthenticatedAudit::Write(const std::string& peer, const Minute& m) {
  std::string detail = absl::StrCat(m.counted + 1, " unauthenticated calls from ", peer, " in the last minute (");
  bool first = true;
  for (const auto& [action, n] : m.actions) {
    absl::StrAppend(&detail, first ? "" : ", ", action, " ", n);
    first = false;
  }
  absl::StrAppend(&detail, "; the first is recorded on its own)");
  ftd::v1::AuditRecord r;
  r.set_unix_ms(clock_->UnixMs());
  r.set_peer(peer);
  r.set_action(m.actions.size() == 1 ? m.actions.begin()->first : "(several)");
  r.set_code("UNAUTHENTICATED");
  r.set_detail(detail);
  r.set_message(m.message.substr(0, 500));
  if (auto st = store_->Audit(std::move(r)); !st.ok()) FtdLog() << "audit log: " << st.message();
}

void UnauthenticatedAudit::Flush(bool all) {
  const int64_t now = clock_->SteadyMs();
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = minutes_.begin(); it != minutes_.end();) {
    if (!all && now - it->second.start_ms < window_ms_) {
      ++it;
      continue;
    }
    if (it->second.counted > 0) Write(it->first, it->second);
    it = minutes_.erase(it);
  }
}

void UnauthenticatedAudit::Start() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      int64_t next = -1;
      for (const auto& [peer, m] : minutes_) {
        if (next < 0 || m.start_ms + window_ms_ < next) next = m.start_ms + window_ms_;
      }
      if (next < 0) {
        cv_.wait(l);
        continue;
      }
      const int64_t wait = next - clock_->SteadyMs();
      if (wait > 0) {
        cv_.wait_for(l, std::chrono::milliseconds(wait));
        continue;
      }
      l.unlock();
      Flush();
      l.lock();
    }
  });
}

}  // namespace ftd::server
