#include "spec/duration.h"

#include <charconv>
#include <string>

#include "absl/strings/str_cat.h"

namespace ftd::spec {

absl::StatusOr<int64_t> ParseAge(std::string_view text) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("\"", std::string(text), "\" is not a duration: use a whole number and a unit, ",
                                                   "d, h, m or s (7d, 12h, 90m)"));
  };
  if (text.size() < 2) return bad();
  int64_t unit = 0;
  switch (text.back()) {
    case 'd': unit = 86400'000; break;
    case 'h': unit = 3600'000; break;
    case 'm': unit = 60'000; break;
    case 's': unit = 1000; break;
    default: return bad();
  }
  const std::string_view digits = text.substr(0, text.size() - 1);
  int64_t n = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size() || n < 0 || n > 100'000) return bad();
  return n * unit;
}

}  // namespace ftd::spec
