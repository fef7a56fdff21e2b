// "Did you mean": the known name closest to a mistyped one, by edit distance. Shared by ftctl's
// commands and flags and the spec's field names (spec.h), so both suggest by the same rule.
#pragma once

#include <string>
#include <vector>

namespace ftd::spec {

// The Levenshtein distance between `a` and `b` (insertions, deletions, substitutions of one byte).
size_t EditDistance(const std::string& a, const std::string& b);

// The candidate closest to `typed` by edit distance, if close enough to be a typo (at most 2 edits,
// or a third of its length); "" otherwise. Among equally close ones the first, unless a later one
// starts with what was typed.
std::string ClosestMatch(const std::string& typed, const std::vector<std::string>& candidates);

}  // namespace ftd::spec
