// The pre-tokenizer's split patterns on PCRE2 (Debian's libpcre2-8, JIT-compiled once).
//
// HF `tokenizers` compiles split patterns with Oniguruma (Ruby syntax). TranslateOnigPattern turns
// such a pattern into a PCRE2 pattern with the same meaning, or refuses it naming the construct:
//   - \s and \S become explicit classes of the Unicode White_Space characters (PCRE2 also counts
//     U+180E as a space; Oniguruma does not), \w/\W the class Oniguruma uses (letters, marks,
//     numbers, connector punctuation), \h/\H hex digits (Oniguruma) rather than horizontal space
//     (PCRE2), \v the vertical tab, \uHHHH a code point; \p{..}/\P{..}, \d, \r, \n, \t, \f, \e,
//     \a, \xHH, \x{..}, \A, \z, \Z and escaped punctuation pass through.
//   - `.` matches a newline and ^/$ match at line breaks, as in HF's Oniguruma build.
//   - Inline option groups may only set or clear `i` (Oniguruma's `m` means PCRE2's `s`).
//   - Nested classes and class operations (`[a[b]]`, `&&`) are refused.
// Patterns are compiled with PCRE2_UTF | PCRE2_UCP (Unicode properties and case folding). One
// difference remains: PCRE2 10.42 (Debian 12) knows Unicode 14.0, HF tokenizers 0.23's Oniguruma
// Unicode 16.0, so the letters and numbers assigned in Unicode 15.0-16.0 (CJK Extensions H and I,
// Egyptian Hieroglyphs Extended-A, seven new scripts) are not \p{L}/\p{N} here.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace ftd::data {

absl::StatusOr<std::string> TranslateOnigPattern(std::string_view onig);

// Per-thread match state, usable with any SplitRegex.
class MatchScratch {
 public:
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

 private:
  friend class SplitRegex;
  pcre2_real_match_data_8* data_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;
  pcre2_real_jit_stack_8* jit_stack_ = nullptr;
};

// A compiled pattern; immutable and shared by threads.
class SplitRegex {
 public:
  // An HF "Regex" pattern (Oniguruma syntax), translated as above.
  static absl::StatusOr<std::unique_ptr<SplitRegex>> FromOniguruma(std::string_view pattern);
  // An HF "String" pattern: the literal text.
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Literal(std::string_view text);
  // A PCRE2 pattern as is (UTF, UCP); `what` names it in errors.
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Pcre2(std::string_view pattern, std::string_view what);
  ~SplitRegex();

  // Finds the leftmost match in `subject` (valid UTF-8) at or after byte `start`. Returns 1 with
  // [*begin, *end) on a match, 0 when there is none, or an error.
  absl::StatusOr<bool> Find(std::string_view subject, size_t start, MatchScratch* scratch, size_t* begin,
                            size_t* end) const;
  // Whether the pattern matches at exactly byte `start` of `subject`.
  absl::StatusOr<bool> MatchesAt(std::string_view subject, size_t start, MatchScratch* scratch) const;

  const std::string& pcre2_pattern() const { return pattern_; }

 private:
  SplitRegex() = default;
  absl::StatusOr<bool> Run(std::string_view subject, size_t start, unsigned options, MatchScratch* scratch,
                           size_t* begin, size_t* end) const;
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(std::string pattern, unsigned options,
                                                             std::string_view what);
  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

// The PCRE2 library version and the Unicode version of its tables, e.g. "10.42 2022-12-11", "14.0.0".
std::string Pcre2Version();
std::string Pcre2UnicodeVersion();

// Unicode White_Space (25 code points), the definition of \s in Oniguruma and Rust's regex.
bool IsUnicodeWhiteSpace(char32_t c);

}  // namespace ftd::data
