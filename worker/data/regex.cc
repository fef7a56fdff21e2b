#include "worker/data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/data/strings.h"

namespace ftd::data {
namespace {

// Unicode White_Space, as a PCRE2 class body (no brackets).
constexpr std::string_view kWhiteSpaceClass =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr std::string_view kHexClass = "0-9a-fA-F";

bool IsHex(char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)); }

absl::Status Refuse(std::string_view pattern, size_t pos, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "split pattern %s: %s at offset %d is not supported (its Oniguruma meaning has no exact PCRE2 translation "
      "here); use \\p{..} classes instead",
      pattern, what, pos));
}

std::string PcreError(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return absl::StrCat("PCRE2 error ", code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

bool IsUnicodeWhiteSpace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

absl::StatusOr<std::string> TranslateOnigPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t class_start = 0;  // offset of the first char after `[` or `[^`
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return Refuse(p, i, "a trailing backslash");
      const char e = p[++i];
      switch (e) {
        case 's':
          out += in_class ? std::string(kWhiteSpaceClass) : absl::StrCat("[", Av(kWhiteSpaceClass), "]");
          continue;
        case 'S':
          if (in_class) return Refuse(p, i - 1, "\\S inside a character class");
          out += absl::StrCat("[^", Av(kWhiteSpaceClass), "]");
          continue;
        case 'h':
          out += in_class ? std::string(kHexClass) : absl::StrCat("[", Av(kHexClass), "]");
          continue;
        case 'H':
          if (in_class) return Refuse(p, i - 1, "\\H inside a character class");
          out += absl::StrCat("[^", Av(kHexClass), "]");
          continue;
        case 'v':
          out += "\\x{0B}";
          continue;
        case 'u': {
          if (i + 4 >= p.size() || !(IsHex(p[i + 1]) && IsHex(p[i + 2]) && IsHex(p[i + 3]) && IsHex(p[i + 4]))) {
            return Refuse(p, i - 1, "\\u without four hex digits");
          }
          absl::StrAppend(&out, "\\x{", Av(p.substr(i + 1, 4)), "}");
          i += 4;
          continue;
        }
        case 'x': {
          if (i + 1 < p.size() && p[i + 1] == '{') {
            const size_t close = p.find('}', i + 1);
            if (close == std::string_view::npos) return Refuse(p, i - 1, "an unterminated \\x{");
            absl::StrAppend(&out, "\\", Av(p.substr(i, close - i + 1)));
            i = close;
            continue;
          }
          size_t k = 0;
          while (k < 2 && i + 1 + k < p.size() && IsHex(p[i + 1 + k])) ++k;
          if (k == 0) return Refuse(p, i - 1, "\\x without hex digits");
          const int v = std::stoi(std::string(p.substr(i + 1, k)), nullptr, 16);
          if (v >= 0x80) return Refuse(p, i - 1, "\\xHH above 7F (a raw byte in Oniguruma)");
          absl::StrAppend(&out, "\\x{", Av(p.substr(i + 1, k)), "}");
          i += k;
          continue;
        }
        case 'p':
        case 'P': {
          // \pL or \p{Name} / \p{^Name}: the same in both dialects; PCRE2 rejects unknown names.
          out += '\\';
          out += e;
          if (i + 1 < p.size() && p[i + 1] == '{') {
            const size_t close = p.find('}', i + 1);
            if (close == std::string_view::npos) return Refuse(p, i - 1, "an unterminated \\p{");
            out += p.substr(i + 1, close - i);
            i = close;
          } else if (i + 1 < p.size()) {
            out += p[++i];
          }
          continue;
        }
        case 'd':
        case 'D':
        case 'r':
        case 'n':
        case 't':
        case 'f':
        case 'e':
        case 'a':
          out += '\\';
          out += e;
          continue;
        case 'A':
        case 'z':
        case 'Z':
          if (in_class) return Refuse(p, i - 1, absl::StrCat("\\", std::string(1, e), " inside a character class"));
          out += '\\';
          out += e;
          continue;
        default:
          if (absl::ascii_isalnum(static_cast<unsigned char>(e))) {
            return Refuse(p, i - 1, absl::StrCat("the escape \\", std::string(1, e)));
          }
          if (static_cast<unsigned char>(e) >= 0x80) return Refuse(p, i - 1, "a backslash before a non-ASCII character");
          out += '\\';
          out += e;
          continue;
      }
    }
    if (in_class) {
      if (c == '[') return Refuse(p, i, "a nested class or POSIX bracket inside a character class");
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') return Refuse(p, i, "class intersection &&");
      if (c == ']') {
        if (i == class_start) return Refuse(p, i, "a `]` at the start of a character class");
        in_class = false;
      }
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out += '^';
        ++i;
      }
      class_start = i + 1;
      continue;
    }
    if (c == '{' && i + 1 < p.size() && p[i + 1] == ',') return Refuse(p, i, "the quantifier {,n}");
    if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      const size_t j = i + 2;
      if (j >= p.size()) return Refuse(p, i, "an unterminated group");
      const char g = p[j];
      if (g == ':' || g == '=' || g == '!' || g == '>' || g == '#') {
        out += p.substr(i, 3);
        i = j;
        continue;
      }
      if (g == '<') {  // lookbehind (?<= (?<! or a named group (?<name>
        out += p.substr(i, 3);
        i = j;
        continue;
      }
      // Inline options: only i, optionally negated, then ':' or ')'.
      size_t k = j;
      while (k < p.size() && (p[k] == 'i' || p[k] == '-')) ++k;
      if (k == j || k >= p.size() || (p[k] != ':' && p[k] != ')')) {
        return Refuse(p, i, "an inline option group other than (?i) / (?-i)");
      }
      out += p.substr(i, k - i + 1);
      i = k;
      continue;
    }
    out += c;
  }
  if (in_class) return Refuse(p, p.size(), "an unterminated character class");
  return out;
}

MatchScratch::MatchScratch() {
  data_ = pcre2_match_data_create(1, nullptr);  // the whole match is all we read
  context_ = pcre2_match_context_create(nullptr);
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
}

MatchScratch::~MatchScratch() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(data_);
}

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(std::string pattern, unsigned options,
                                                                 std::string_view what) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   (options & PCRE2_LITERAL) ? options | PCRE2_UTF : options | PCRE2_UTF | PCRE2_UCP, &err, &err_off, cc);
  pcre2_compile_context_free(cc);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: PCRE2 cannot compile %s: %s at offset %d", what, pattern,
                                                      PcreError(err), err_off));
  }
  std::unique_ptr<SplitRegex> re(new SplitRegex());
  re->pattern_ = std::move(pattern);
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::FromOniguruma(std::string_view pattern) {
  auto translated = TranslateOnigPattern(pattern);
  if (!translated.ok()) return translated.status();
  return Compile(*std::move(translated), PCRE2_DOTALL | PCRE2_MULTILINE,
                 absl::StrCat("split pattern ", Av(pattern)));
}

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Literal(std::string_view text) {
  return Compile(std::string(text), PCRE2_LITERAL, absl::StrCat("split string ", Av(text)));
}

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Pcre2(std::string_view pattern, std::string_view what) {
  return Compile(std::string(pattern), 0, what);
}

SplitRegex::~SplitRegex() { pcre2_code_free(code_); }

absl::StatusOr<bool> SplitRegex::Run(std::string_view subject, size_t start, unsigned options, MatchScratch* scratch,
                                     size_t* begin, size_t* end) const {
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (jit_ && (options & PCRE2_ANCHORED) == 0) {  // JIT code ignores PCRE2_ANCHORED given at match time
    rc = pcre2_jit_match(code_, s, subject.size(), start, options, scratch->data_, scratch->context_);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // fall back to the interpreter, which keeps its frames on the heap
      rc = pcre2_match(code_, s, subject.size(), start, options | PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, scratch->data_,
                       scratch->context_);
    }
  } else {
    rc = pcre2_match(code_, s, subject.size(), start, options | PCRE2_NO_UTF_CHECK, scratch->data_, scratch->context_);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    return absl::InternalError(
        absl::StrFormat("pattern %s failed on a %d-byte piece: %s", pattern_, subject.size(), PcreError(rc)));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch->data_);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

absl::StatusOr<bool> SplitRegex::Find(std::string_view subject, size_t start, MatchScratch* scratch, size_t* begin,
                                      size_t* end) const {
  return Run(subject, start, 0, scratch, begin, end);
}

absl::StatusOr<bool> SplitRegex::MatchesAt(std::string_view subject, size_t start, MatchScratch* scratch) const {
  size_t b, e;
  return Run(subject, start, PCRE2_ANCHORED, scratch, &b, &e);
}

std::string Pcre2Version() {
  char buf[64] = {};
  pcre2_config(PCRE2_CONFIG_VERSION, buf);
  return buf;
}

std::string Pcre2UnicodeVersion() {
  char buf[64] = {};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, buf);
  return buf;
}

}  // namespace ftd::data
