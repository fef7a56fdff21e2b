#include "spec/run_outcome.h"

namespace ftd::spec {

std::optional<Outcome> ParseOutcome(std::string_view name) {
  for (const auto& o : kOutcomes) {
    if (o.name == name) return o.outcome;
  }
  return std::nullopt;
}

}  // namespace ftd::spec
