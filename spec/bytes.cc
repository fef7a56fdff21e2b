#include "spec/bytes.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace ftd::spec {

std::string FormatBytes(double b) {
  constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024, kTiB = kGiB * 1024;
  if (!std::isfinite(b) || b < 0) return "?";
  if (b >= kTiB) return absl::StrFormat("%.1f TiB", b / kTiB);
  if (b >= kGiB) return absl::StrFormat("%.1f GiB", b / kGiB);
  const auto small = [](double v, const char* unit) {
    // 9.96 would print as "10.0": round first, then pick the precision.
    return std::round(v * 10) / 10 < 10 ? absl::StrFormat("%.1f %s", v, unit) : absl::StrFormat("%.0f %s", v, unit);
  };
  if (b >= kMiB) return small(b / kMiB, "MiB");
  if (b >= kKiB) return small(b / kKiB, "KiB");
  return absl::StrFormat("%.0f B", b);
}

}  // namespace ftd::spec
