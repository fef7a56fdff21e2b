#include "spec/profile_table.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/text.h"

namespace ftd::spec {

std::string ProfileTable(const ftd::v1::ProfileReport& p, int top) {
  const char* what = p.device() == "cpu" ? "self CPU" : "self device";
  std::string out = absl::StrFormat(
      "profile: %d step(s), %.1f ms wall and %.1f ms %s time per step, kernel set %s\n\n", p.steps(),
      p.step_wall_ms(), p.step_device_ms(), p.device() == "cpu" ? "CPU" : "device", EscapeControl(p.kernel_set()));
  absl::StrAppendFormat(&out, "%-52s %-9s %-13s %12s %7s %8s %10s\n", "op", "phase", "category",
                        absl::StrCat(what, " ms"), "share", "calls", "host ms");
  int n = 0;
  for (const auto& o : p.ops()) {
    if (top > 0 && n++ >= top) break;
    const std::string op = EscapeControl(o.name());
    std::string name = op.size() > 52 ? op.substr(0, 49) + "..." : op;
    absl::StrAppendFormat(&out, "%-52s %-9s %-13s %12.3f %6.1f%% %8.1f %10.3f\n", name, EscapeControl(o.phase()),
                          EscapeControl(o.category()), o.device_ms(), 100 * o.share(), o.calls(), o.host_ms());
  }
  absl::StrAppend(&out, "\nby category (ms per step):");
  for (const auto& c : p.categories()) {
    if (c.device_ms() > 0) absl::StrAppendFormat(&out, "  %s %.3f", EscapeControl(c.category()), c.device_ms());
  }
  return out + "\n";
}

}  // namespace ftd::spec
