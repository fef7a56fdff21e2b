// Durations as users write them on command lines (ftd --retention 30d, ftctl prune --older-than 7d).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace ftd::spec {

// "7d", "12h", "90m", "30s" (a whole number and a unit) -> milliseconds. INVALID_ARGUMENT saying the
// form otherwise.
absl::StatusOr<int64_t> ParseAge(std::string_view text);

}  // namespace ftd::spec
