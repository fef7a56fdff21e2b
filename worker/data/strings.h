// String helpers for the tokenizer module. Debian 12's Abseil (20220623) has its own
// absl::string_view, distinct from std::string_view: Av/Sv convert, and the hash maps below look
// std::string keys up by std::string_view without a copy.
#pragma once

#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace ftd::data {

inline absl::string_view Av(std::string_view s) { return {s.data(), s.size()}; }
inline std::string_view Sv(absl::string_view s) { return {s.data(), s.size()}; }

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return absl::Hash<absl::string_view>{}(Av(s)); }
};
struct StringEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

template <class V>
using StringMap = absl::flat_hash_map<std::string, V, StringHash, StringEq>;
using StringSet = absl::flat_hash_set<std::string, StringHash, StringEq>;
template <class V>
using StringViewMap = absl::flat_hash_map<std::string_view, V, StringHash, StringEq>;

}  // namespace ftd::data
