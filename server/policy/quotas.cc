#include "server/policy/quotas.h"

#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ftd::server {

std::string UserLimits::ToString() const {
  std::vector<std::string> parts;
  if (max_queued > 0) parts.push_back(absl::StrCat("queued=", max_queued));
  if (max_running > 0) parts.push_back(absl::StrCat("running=", max_running));
  if (gpu_hours > 0) parts.push_back(absl::StrCat("gpu-hours=", gpu_hours));
  return parts.empty() ? "none" : absl::StrJoin(parts, ",");
}

const UserLimits& QuotaConfig::For(const std::string& user) const {
  auto it = users.find(user);
  return it == users.end() ? defaults : it->second;
}

absl::StatusOr<UserLimits> ParseUserLimits(const std::string& text) {
  UserLimits l;
  if (text == "none") return l;
  const std::string fix = " (write queued=N,running=N,gpu-hours=X, any of them, or none)";
  bool seen[3] = {false, false, false};
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(text, ','))) {
    const size_t eq = part.find('=');
    const std::string key = part.substr(0, eq), value = eq == std::string::npos ? "" : part.substr(eq + 1);
    int which = key == "queued" ? 0 : key == "running" ? 1 : key == "gpu-hours" ? 2 : -1;
    if (which < 0) return absl::InvalidArgumentError(absl::StrCat("unknown limit \"", key, "\"", fix));
    if (seen[which]) return absl::InvalidArgumentError(absl::StrCat("limit \"", key, "\" given twice", fix));
    seen[which] = true;
    if (which == 2) {
      double v = 0;
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) || v <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("gpu-hours must be a number > 0 (got \"", value, "\"); leave it out for no limit"));
      }
      l.gpu_hours = v;
    } else {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v) || v < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, " must be a whole number >= 1 (got \"", value, "\"); leave it out for no limit"));
      }
      (which == 0 ? l.max_queued : l.max_running) = v;
    }
  }
  return l;
}

absl::StatusOr<std::pair<std::string, UserLimits>> ParseUserLimit(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" names no user: write USER:queued=N,running=N,gpu-hours=X"));
  }
  auto l = ParseUserLimits(text.substr(colon + 1));
  if (!l.ok()) return absl::InvalidArgumentError(absl::StrCat("user ", text.substr(0, colon), ": ", l.status().message()));
  return std::make_pair(text.substr(0, colon), *l);
}

std::string HoursText(int64_t ms) {
  const double h = static_cast<double>(ms) / 3600'000.0;
  if (h >= 48 && std::fmod(h, 24) == 0) return absl::StrFormat("%.0f d", h / 24);
  if (h >= 1) return absl::StrFormat("%g h", h);
  return absl::StrFormat("%g min", h * 60);
}

}  // namespace ftd::server
