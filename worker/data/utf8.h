// UTF-8 validation and repair for text fed to the tokenizer.
//
// Policy for invalid input: every maximal ill-formed subsequence becomes one U+FFFD (REPLACEMENT
// CHARACTER), the "substitution of maximal subparts" practice of the Unicode Standard (chapter 3,
// U+FFFD substitution) that Python's `bytes.decode("utf-8", errors="replace")` and Rust's
// `String::from_utf8_lossy` follow. So a byte string encodes to the same ids here as its
// Python-decoded str does in HF `tokenizers`. Surrogate code points (ED A0..BF xx), overlong forms
// (C0, C1, E0 80..9F, F0 80..8F) and code points above U+10FFFF (F4 90.., F5..FF) are ill-formed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ftd::data {

// Length of the longest valid UTF-8 prefix of `s` (== s.size() when `s` is valid).
size_t ValidUtf8Prefix(std::string_view s);

inline bool IsValidUtf8(std::string_view s) { return ValidUtf8Prefix(s) == s.size(); }

// Appends `s` to `out` with each maximal ill-formed subsequence replaced by U+FFFD (EF BF BD).
void AppendRepairedUtf8(std::string_view s, std::string* out);

// Appends the UTF-8 encoding of code point `cp` (which must be a Unicode scalar value).
void AppendUtf8(char32_t cp, std::string* out);

// Decodes the code point starting at s[i] of VALID UTF-8; sets *len to its byte length.
char32_t DecodeUtf8At(std::string_view s, size_t i, size_t* len);

}  // namespace ftd::data
