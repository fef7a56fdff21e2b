#include "spec/closest_match.h"

#include <algorithm>

#include "absl/strings/match.h"

namespace ftd::spec {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string ClosestMatch(const std::string& typed, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, typed.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = EditDistance(typed, c);
    if (d < best_d || (d == best_d && !best.empty() && absl::StartsWith(c, typed))) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

}  // namespace ftd::spec
