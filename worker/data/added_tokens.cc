#include "worker/data/added_tokens.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/data/utf8.h"

namespace ftd::data {
namespace {

using json = nlohmann::json;

bool IsContinuation(char c) { return (static_cast<uint8_t>(c) & 0xC0) == 0x80; }

// Byte offset of the character that ends just before `pos`.
size_t PrevCharStart(std::string_view text, size_t pos) {
  size_t i = pos - 1;
  while (i > 0 && IsContinuation(text[i])) --i;
  return i;
}

}  // namespace

void AddedVocabulary::Matcher::Add(std::string_view content, uint32_t id) {
  uint32_t node = 0;
  for (char ch : content) {
    const uint64_t key = (uint64_t{node} << 8) | static_cast<uint8_t>(ch);
    auto it = edges.find(key);
    if (it == edges.end()) {
      nodes.push_back(Node{});
      it = edges.emplace(key, static_cast<uint32_t>(nodes.size() - 1)).first;
    }
    node = it->second;
  }
  nodes[node].token = id;
  first_byte[static_cast<uint8_t>(content[0])] = true;
  empty = false;
}

size_t AddedVocabulary::Matcher::LongestAt(std::string_view text, size_t pos, int64_t* id) const {
  uint32_t node = 0;
  size_t best = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges.find((uint64_t{node} << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges.end()) break;
    node = it->second;
    if (nodes[node].token >= 0) {
      best = i + 1 - pos;
      *id = nodes[node].token;
    }
  }
  return best;
}

absl::Status AddedVocabulary::Load(const json& added, const BpeModel& model) {
  if (added.is_null()) return absl::OkStatus();
  if (!added.is_array()) return absl::InvalidArgumentError("added_tokens: expected an array");
  uint32_t next_id = static_cast<uint32_t>(model.size());
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected an object with a string \"content\""));
    }
    AddedToken tok;
    tok.content = t["content"].get<std::string>();
    for (auto [name, field] : {std::pair{"single_word", &tok.single_word}, std::pair{"lstrip", &tok.lstrip},
                               std::pair{"rstrip", &tok.rstrip}, std::pair{"normalized", &tok.normalized},
                               std::pair{"special", &tok.special}}) {
      if (!t.contains(name)) continue;
      if (!t[name].is_boolean()) return absl::InvalidArgumentError(absl::StrCat(where, ".", name, ": expected a boolean"));
      *field = t[name].get<bool>();
    }
    if (tok.content.empty()) continue;  // HF ignores empty tokens
    // HF's id rule (AddedVocabulary::add_tokens): an existing added token, then the model's
    // vocabulary, then the next free id.
    uint32_t id;
    if (auto it = by_content_.find(tok.content); it != by_content_.end()) {
      id = it->second;
    } else if (const uint32_t* mid = model.FindText(tok.content)) {
      id = *mid;
    } else {
      id = next_id++;
    }
    if (t.contains("id")) {
      if (!t["id"].is_number_unsigned() || t["id"].get<uint64_t>() != id) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: \"%s\" has id %s, but HF tokenizers gives it id %d (%s); the file is inconsistent", where,
            tok.content, t["id"].dump(), id,
            model.FindText(tok.content) ? "its id in model.vocab"
                                        : "added tokens not in model.vocab take consecutive ids after it"));
      }
    }
    tok.id = id;
    by_content_[tok.content] = id;
    if (tok.special) special_.insert(tok.content);
    id_limit_ = std::max(id_limit_, id + 1);
    by_id_[id] = std::move(tok);
  }
  bool single_word = false;
  for (const auto& [id, tok] : by_id_) {
    (tok.normalized ? normalized_ : raw_).Add(tok.content, id);
    single_word |= tok.single_word;
  }
  if (single_word) {
    // Rust regex's Unicode \w, which HF uses for single_word.
    auto re = SplitRegex::Pcre2(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])", "word characters");
    if (!re.ok()) return re.status();
    word_char_ = *std::move(re);
  }
  return absl::OkStatus();
}

const AddedToken* AddedVocabulary::ById(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

std::optional<uint32_t> AddedVocabulary::IdOf(std::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

std::vector<const AddedToken*> AddedVocabulary::Tokens() const {
  std::vector<const AddedToken*> out;
  for (const auto& [id, tok] : by_id_) out.push_back(&tok);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->id < b->id; });
  return out;
}

absl::StatusOr<bool> AddedVocabulary::IsWordCharAt(std::string_view text, size_t pos, MatchScratch* scratch) const {
  return word_char_->MatchesAt(text, pos, scratch);
}

absl::Status AddedVocabulary::FindMatches(std::string_view text, size_t base, const Matcher& m, MatchScratch* scratch,
                                          std::vector<Segment>* out) const {
  if (text.empty()) return absl::OkStatus();
  if (m.empty) {
    out->push_back({base, base + text.size(), -1});
    return absl::OkStatus();
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // Leftmost-longest: the first position where a token starts, its longest token there.
    const auto* p = reinterpret_cast<const uint8_t*>(text.data());
    while (pos < text.size() && !m.first_byte[p[pos]]) ++pos;
    if (pos >= text.size()) break;
    int64_t id = -1;
    const size_t len = m.LongestAt(text, pos, &id);
    if (len == 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;  // the search goes on after the match, whatever lstrip/rstrip take below
    const AddedToken& tok = by_id_.at(static_cast<uint32_t>(id));
    if (tok.single_word) {
      bool start_space = start == 0, stop_space = stop == text.size();
      if (!start_space) {
        auto w = IsWordCharAt(text, PrevCharStart(text, start), scratch);
        if (!w.ok()) return w.status();
        start_space = !*w;
      }
      if (!stop_space) {
        auto w = IsWordCharAt(text, stop, scratch);
        if (!w.ok()) return w.status();
        stop_space = !*w;
      }
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        const size_t c = PrevCharStart(text, s);
        size_t clen;
        if (!IsUnicodeWhiteSpace(DecodeUtf8At(text, c, &clen))) break;
        s = c;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        size_t clen;
        if (!IsUnicodeWhiteSpace(DecodeUtf8At(text, stop, &clen))) break;
        stop += clen;
      }
    }
    if (start_offset < start) out->push_back({base + start_offset, base + start, -1});
    out->push_back({base + start, base + stop, id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({base + start_offset, base + text.size(), -1});
  return absl::OkStatus();
}

absl::Status AddedVocabulary::Split(std::string_view text, MatchScratch* scratch, std::vector<Segment>* out) const {
  if (text.empty()) return absl::OkStatus();
  if (normalized_.empty) return FindMatches(text, 0, raw_, scratch, out);
  if (raw_.empty) return FindMatches(text, 0, normalized_, scratch, out);
  std::vector<Segment> first;
  if (auto st = FindMatches(text, 0, raw_, scratch, &first); !st.ok()) return st;
  for (const Segment& s : first) {
    if (s.id >= 0) {
      out->push_back(s);
    } else if (auto st = FindMatches(text.substr(s.begin, s.end - s.begin), s.begin, normalized_, scratch, out);
               !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace ftd::data
