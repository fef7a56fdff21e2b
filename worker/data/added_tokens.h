// Added and special tokens (tokenizer.json `added_tokens`): matched in the text before
// pre-tokenization, as HF's AddedVocabulary does.
//
// Ids follow HF's loading rule: a token spelled like a model vocabulary entry takes that entry's id,
// the others take consecutive ids from the model's vocabulary size on; a tokenizer.json whose
// recorded ids differ from that is refused (HF would silently use other ids). Tokens with
// normalized=false are matched first in the whole text, then those with normalized=true in the
// gaps (there is no normalizer, so both match the raw text). Matching is leftmost-longest; a
// single_word token only matches between non-word characters (Unicode \w: Alphabetic, marks,
// decimal numbers, connector punctuation, Join_Control), lstrip/rstrip take the Unicode
// White_Space around the token into it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "worker/data/bpe.h"
#include "worker/data/regex.h"
#include "worker/data/strings.h"

namespace ftd::data {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// A piece of the text: an added token (id >= 0) or text to pre-tokenize (id == -1).
struct Segment {
  size_t begin, end;
  int64_t id;
};

class AddedVocabulary {
 public:
  absl::Status Load(const nlohmann::json& added_tokens, const BpeModel& model);

  // Appends the segments of `text` (valid UTF-8), in order; empty ones are left out.
  absl::Status Split(std::string_view text, MatchScratch* scratch, std::vector<Segment>* out) const;

  bool empty() const { return by_id_.empty(); }
  const AddedToken* ById(uint32_t id) const;
  std::optional<uint32_t> IdOf(std::string_view content) const;
  bool IsSpecial(std::string_view content) const { return special_.contains(content); }
  uint32_t id_limit() const { return id_limit_; }
  std::vector<const AddedToken*> Tokens() const;  // by id

 private:
  // Leftmost-longest matching of a set of tokens (a byte trie).
  struct Matcher {
    struct Node {
      int64_t token = -1;  // id of the token ending here
    };
    std::vector<Node> nodes{Node{}};
    absl::flat_hash_map<uint64_t, uint32_t> edges;  // (node << 8 | byte) -> child
    bool first_byte[256] = {};
    bool empty = true;
    void Add(std::string_view content, uint32_t id);
    // The longest token starting at text[pos]: its length, or 0.
    size_t LongestAt(std::string_view text, size_t pos, int64_t* id) const;
  };
  // HF's find_matches on one piece: appends segments with offsets shifted by `base`.
  absl::Status FindMatches(std::string_view text, size_t base, const Matcher& m, MatchScratch* scratch,
                           std::vector<Segment>* out) const;
  absl::StatusOr<bool> IsWordCharAt(std::string_view text, size_t pos, MatchScratch* scratch) const;

  StringMap<uint32_t> by_content_;
  absl::flat_hash_map<uint32_t, AddedToken> by_id_;
  StringSet special_;
  Matcher raw_, normalized_;
  std::unique_ptr<SplitRegex> word_char_;  // only when a token is single_word
  uint32_t id_limit_ = 0;
};

}  // namespace ftd::data
