#include "worker/data/utf8.h"

#include <cstring>

namespace ftd::data {
namespace {

// The well-formed byte sequences of the Unicode Standard, Table 3-7: for a lead byte, the range of
// the second byte (the ranges of the third and fourth are always 80..BF).
struct Lead {
  uint8_t len;  // total sequence length; 0 for a byte that cannot start a sequence
  uint8_t lo, hi;
};

constexpr Lead LeadOf(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b >= 0xE1 && b <= 0xEC) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xEE && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes of the well-formed prefix of the sequence at s[i]: its full length when it is
// well formed, else the length of its maximal ill-formed subpart (at least 1) with *ok = false.
inline size_t SequenceAt(const uint8_t* s, size_t n, size_t i, bool* ok) {
  const Lead lead = LeadOf(s[i]);
  if (lead.len == 0) {
    *ok = false;
    return 1;
  }
  size_t k = 1;
  for (; k < lead.len; ++k) {
    if (i + k >= n) break;
    const uint8_t c = s[i + k];
    const uint8_t lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
    if (c < lo || c > hi) break;
  }
  *ok = k == lead.len;
  return k;
}

inline bool AllAscii8(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return (w & 0x8080808080808080ULL) == 0;
}

}  // namespace

size_t ValidUtf8Prefix(std::string_view sv) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  const size_t n = sv.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n && AllAscii8(sv.data() + i)) {
      i += 8;
      continue;
    }
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    bool ok;
    const size_t k = SequenceAt(s, n, i, &ok);
    if (!ok) return i;
    i += k;
  }
  return n;
}

void AppendRepairedUtf8(std::string_view sv, std::string* out) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  const size_t n = sv.size();
  size_t i = 0;
  while (i < n) {
    const size_t valid = ValidUtf8Prefix(sv.substr(i));
    out->append(sv.data() + i, valid);
    i += valid;
    if (i >= n) break;
    bool ok;
    i += SequenceAt(s, n, i, &ok);  // ok is false here: the maximal ill-formed subpart
    out->append("\xEF\xBF\xBD");
  }
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t DecodeUtf8At(std::string_view sv, size_t i, size_t* len) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  const uint8_t b = s[i];
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  if (b < 0xE0) {
    *len = 2;
    return (char32_t{b & 0x1Fu} << 6) | (s[i + 1] & 0x3F);
  }
  if (b < 0xF0) {
    *len = 3;
    return (char32_t{b & 0x0Fu} << 12) | (char32_t{s[i + 1] & 0x3Fu} << 6) | (s[i + 2] & 0x3F);
  }
  *len = 4;
  return (char32_t{b & 0x07u} << 18) | (char32_t{s[i + 1] & 0x3Fu} << 12) | (char32_t{s[i + 2] & 0x3Fu} << 6) |
         (s[i + 3] & 0x3F);
}

}  // namespace ftd::data
