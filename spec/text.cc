#include "spec/text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ftd::spec {
namespace {

// The code point of the UTF-8 sequence at s[i] and its length; length 0 when the bytes there are
// not valid UTF-8 (a stray continuation byte, a truncated or overlong sequence, a surrogate).
std::pair<uint32_t, size_t> Decode(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return {c, 1};
  size_t n = 0;
  uint32_t cp = 0, min = 0;
  if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return {0, 0};
  }
  if (i + n > s.size()) return {0, 0};
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return {0, 0};
    cp = cp << 6 | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, n};
}

bool IsControl(uint32_t cp) { return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); }

std::string_view ControlName(uint32_t cp) {
  switch (cp) {
    case 0x00: return "a NUL";
    case 0x09: return "a tab";
    case 0x0A: return "a newline";
    case 0x0D: return "a carriage return";
    case 0x1B: return "an escape";
    case 0x7F: return "a delete";
    default: return "";
  }
}

}  // namespace

std::optional<ControlChar> FindControlChar(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto [cp, n] = Decode(s, i);
    if (n == 0) {
      ++i;
      continue;
    }
    if (IsControl(cp)) return ControlChar{i, cp};
    i += n;
  }
  return std::nullopt;
}

absl::Status CheckNoControlChars(std::string_view s, std::string_view field) {
  const auto c = FindControlChar(s);
  if (!c.has_value()) return absl::OkStatus();
  const std::string_view name = ControlName(c->code);
  const std::string what =
      absl::StrFormat("U+%04X%s%s, at byte %d", c->code, name.empty() ? "" : ", ", std::string(name), c->offset);
  if (c->code == 0 && (field.ends_with("path") || field.ends_with("dir"))) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(field), " holds a NUL byte (", what,
                                                   "): a path cannot hold one; remove it"));
  }
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), " holds a control character (", what,
                                                 "): text fields take printable text only; remove it"));
}

std::string EscapeControl(std::string_view s, std::string_view keep) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto [cp, n] = Decode(s, i);
    if (n == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(s[i]));
      ++i;
      continue;
    }
    if (!IsControl(cp) || (cp < 0x80 && keep.find(static_cast<char>(cp)) != std::string_view::npos)) {
      out.append(s.substr(i, n));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x80) {
      absl::StrAppendFormat(&out, "\\x%02x", cp);
    } else {
      absl::StrAppendFormat(&out, "\\u%04x", cp);
    }
    i += n;
  }
  return out;
}

}  // namespace ftd::spec
