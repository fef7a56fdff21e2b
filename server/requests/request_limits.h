// Bounds on what a client may send, checked at submit before anything else reads the request:
// the length and UTF-8 of every string field (found by reflection, so a new field is covered
// without an edit here) and the number of entries of repeated and map fields. And Clip, through
// which every message that quotes a client's or a worker's text goes, so that no record, event or
// error grows with its input.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace ftd::server {

inline constexpr size_t kMaxPathBytes = 4096;  // string fields named *path or *dir (PATH_MAX)
inline constexpr size_t kMaxNameBytes = 256;   // every other string field: names, owners, values, map keys
inline constexpr int kMaxEntries = 64;         // entries of a repeated or map field
inline constexpr size_t kMaxQuoted = 160;      // bytes of someone else's text quoted in a message
inline constexpr size_t kMaxWorkerText = 4096; // bytes of a worker's result message or log line kept

// INVALID_ARGUMENT naming the first field (`prefix` + its path, "spec.data.path") that is too long,
// not valid UTF-8, or has too many entries.
absl::Status CheckRequestStrings(const google::protobuf::Message& m, const std::string& prefix = "");

// For a request that failed to parse: the path of the first string field of `type` in the wire
// bytes whose value is not valid UTF-8 ("spec.data.path"), or "" if there is none.
std::string FindInvalidUtf8(const google::protobuf::Descriptor* type, std::string_view wire);

// `s` if it has at most `max` bytes; else its head and tail around " … (N bytes) … ", cut on UTF-8
// character boundaries (the tail keeps the end of an error, which usually says what went wrong).
std::string Clip(std::string_view s, size_t max = kMaxQuoted);

}  // namespace ftd::server
