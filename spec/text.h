// Text that users send (job names, request ids, paths, token descriptions) on its way to a record,
// a log line or a terminal. Two rules, shared by ftctl, ftd and ftd-worker:
//  - at a trust boundary, a text field holding a control character is refused, naming the field
//    (a newline forges a log line or splits a table; an escape sequence retitles or clears the
//    terminal that shows it);
//  - text that still reaches a log line or a terminal (older records, messages quoting files, worker
//    output) has its control characters written as visible escapes.
// Control characters: C0 (U+0000..U+001F), DEL (U+007F) and C1 (U+0080..U+009F; U+009B is CSI
// on terminals that take 8-bit controls). No protobuf here: the engine's translation units may use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ftd::spec {

struct ControlChar {
  size_t offset = 0;   // byte offset in the text
  uint32_t code = 0;   // the code point
};

// The first control character of `s`, if any. Bytes that are not UTF-8 are not control characters
// here (callers that need UTF-8 check it first).
std::optional<ControlChar> FindControlChar(std::string_view s);

// INVALID_ARGUMENT naming `field` when `s` holds a control character:
// `name holds a control character (U+000A, a newline, at byte 5): text fields take printable text only; remove it`
// (a NUL in a path says that a path cannot hold one).
absl::Status CheckNoControlChars(std::string_view s, std::string_view field);

// `s` with every control character written as an escape (\n, \r, \t, \x1b, \u009b) and every byte
// that is not part of valid UTF-8 as \xNN, so that what it prints is what it shows. Characters in
// `keep` (only "\n" and "\t" make sense) pass unchanged.
std::string EscapeControl(std::string_view s, std::string_view keep = "");

}  // namespace ftd::spec
