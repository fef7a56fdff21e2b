// The pre-tokenizer of tokenizer.json: Split stages (a regex or a literal string, with HF's five
// delimiter behaviours and `invert`), then ByteLevel (optionally a prefix space and GPT-2's split
// pattern), nested in Sequences as HF writes them. Pieces stay raw bytes: the ByteLevel byte->char
// mapping is folded into the BPE vocabulary (bpe.h).
//
// LLaMA-3: Sequence[Split(Regex <its pattern>, Isolated), ByteLevel(add_prefix_space=false,
// use_regex=false)]. GPT-2: ByteLevel(add_prefix_space=false, use_regex=true).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "worker/data/regex.h"

namespace ftd::data {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// GPT-2's pattern, which ByteLevel(use_regex=true) splits with.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  struct Scratch {
    MatchScratch match;
    struct Piece {
      size_t begin, end;
      bool is_match;
    };
    std::vector<std::vector<Piece>> pieces;  // per stage
    std::vector<std::string> buffers;        // per stage (prefix space)
  };

  absl::Status Load(const nlohmann::json& pre_tokenizer);

  // Calls emit(piece) for each non-empty piece of `text` (valid UTF-8), in order.
  absl::Status Run(std::string_view text, Scratch* scratch, absl::FunctionRef<void(std::string_view)> emit) const;

  std::string Describe() const;

 private:
  struct Stage {
    enum class Kind { kSplit, kPrefixSpace } kind;
    std::shared_ptr<const SplitRegex> re;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    std::string description;
  };
  absl::Status Add(const nlohmann::json& node, const std::string& where, bool* byte_level_seen);
  absl::Status RunStage(size_t k, std::string_view piece, Scratch* sc,
                        absl::FunctionRef<void(std::string_view)> emit) const;

  std::vector<Stage> stages_;
};

}  // namespace ftd::data
