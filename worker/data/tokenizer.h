// A model's own tokenizer: HF `tokenizers`' byte-level BPE, read from a model directory's
// tokenizer.json (and tokenizer_config.json for BOS/EOS), written here because no Debian or PyPI
// C++ library implements HF byte-level BPE. Torch-free and protobuf-free.
//
// Encoding follows `tokenizers.Tokenizer.encode(text)` (checked id for id against the PyPI package
// in tests/python/test_tokenizer.py):
//   1. invalid UTF-8 is repaired first, each maximal ill-formed subsequence becoming U+FFFD, as
//      Python's bytes.decode("utf-8", errors="replace") does (utf8.h);
//   2. added and special tokens are cut out of the raw text (added_tokens.h);
//   3. the rest is pre-tokenized (pretokenizer.h: Split regexes on PCRE2, regex.h; ByteLevel);
//   4. each piece becomes BPE tokens (bpe.h), through a per-Encoder cache of recent pieces;
//   5. the post-processor's template adds BOS (TemplateProcessing; ByteLevel changes no ids).
// Supported: model BPE (vocab; merges as "a b" or ["a", "b"]; ignore_merges), no normalizer,
// pre-tokenizers Sequence/Split/ByteLevel, post-processors TemplateProcessing/ByteLevel/Sequence,
// the ByteLevel decoder, added tokens with lstrip/rstrip/single_word/normalized. Anything else is
// refused at load with a message naming the field.
//
// Decoding follows `tokenizers.Tokenizer.decode(ids, skip_special_tokens)`: tokens' ByteLevel
// characters back to bytes (tokens with other characters, e.g. added tokens with spaces, as their
// UTF-8), then the bytes as UTF-8 with U+FFFD for ill-formed parts. An id the tokenizer does not
// have is an error here (HF drops it silently).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/added_tokens.h"
#include "worker/data/bpe.h"
#include "worker/data/pretokenizer.h"
#include "worker/data/strings.h"

namespace ftd::data {

struct EncodeOptions {
  bool add_special_tokens = true;  // the post-processor's template (LLaMA-3: BOS first)
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadDir(const std::string& dir);
  // The same from the files' contents; `config_json` may be empty. `source` names them in errors.
  static absl::StatusOr<std::shared_ptr<const Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                                   std::string_view config_json,
                                                                   std::string_view source = "tokenizer.json");

  // Convenience for a few texts; for many, keep an Encoder per thread (its cache is what makes it fast).
  absl::StatusOr<std::vector<uint32_t>> Encode(std::string_view text, const EncodeOptions& options = {}) const;
  absl::StatusOr<std::string> Decode(std::span<const uint32_t> ids, bool skip_special_tokens = false) const;

  // The id of a token, by its tokenizer.json spelling: added tokens first, then the BPE vocabulary.
  std::optional<uint32_t> TokenToId(std::string_view token) const;
  // The tokenizer.json spelling of an id.
  std::optional<std::string> IdToToken(uint32_t id) const;
  bool IsSpecial(uint32_t id) const { return id < special_.size() && special_[id]; }

  // tokenizer_config.json's bos_token / eos_token, when it has them.
  std::optional<uint32_t> bos_id() const { return bos_id_; }
  std::optional<uint32_t> eos_id() const { return eos_id_; }
  // Largest id + 1: every id Encode can return is below it.
  uint32_t vocab_size() const { return vocab_size_; }
  const BpeModel& model() const { return model_; }
  const AddedVocabulary& added() const { return added_; }
  const PreTokenizer& pre_tokenizer() const { return pre_; }
  std::span<const uint32_t> template_prefix() const { return prefix_; }
  std::span<const uint32_t> template_suffix() const { return suffix_; }

 private:
  friend class Encoder;
  Tokenizer() = default;
  absl::Status LoadPostProcessor(const nlohmann::json& node, const std::string& where);
  absl::Status LoadConfig(std::string_view config_json, std::string_view source);

  BpeModel model_;
  AddedVocabulary added_;
  PreTokenizer pre_;
  std::vector<uint32_t> prefix_, suffix_;  // the single-sequence template around $A
  std::vector<std::string> decoded_;       // per id: the bytes Decode writes
  std::vector<bool> known_;                // per id: the tokenizer has it
  std::vector<bool> special_;              // per id: skipped by Decode(skip_special_tokens)
  std::optional<uint32_t> bos_id_, eos_id_;
  uint32_t vocab_size_ = 0;
};

// Encodes with the tokenizer's caches and scratch buffers; not thread-safe: one per thread.
class Encoder {
 public:
  explicit Encoder(const Tokenizer& tokenizer);

  // Appends the ids of `text` (any bytes; see the UTF-8 policy above) to *out.
  absl::Status Encode(std::string_view text, std::vector<uint32_t>* out, const EncodeOptions& options = {});
  // For debugging: the pieces BPE sees, added tokens included (invalid UTF-8 repaired first).
  absl::Status Pieces(std::string_view text, std::vector<std::string>* out);

  const Tokenizer& tokenizer() const { return tok_; }
  size_t cache_entries() const { return cache_.size(); }

 private:
  void EncodePiece(std::string_view piece, std::vector<uint32_t>* out);
  void ClearCache();

  const Tokenizer& tok_;
  PreTokenizer::Scratch pre_scratch_;
  std::vector<Segment> segments_;
  std::string repaired_;
  // Piece cache: piece bytes (in arena_) -> ids (in cache_ids_); cleared when full.
  struct Entry {
    uint32_t offset, len;
  };
  StringViewMap<Entry> cache_;
  std::vector<uint32_t> cache_ids_;
  std::vector<std::unique_ptr<char[]>> arena_;
  size_t arena_used_ = 0;  // bytes used in arena_.back()
  static constexpr size_t kMaxCachedPiece = 64;        // bytes
  static constexpr size_t kMaxCacheEntries = 1 << 18;  // then the cache starts over
  static constexpr size_t kArenaBlock = 1 << 20;
};

// Reads a tokenizer_config.json token field: a string, or an object with "content" (AddedToken).
std::optional<std::string> ConfigTokenContent(const nlohmann::json& value);

}  // namespace ftd::data
