// The byte-level BPE model of an HF tokenizer.json (`model.type == "BPE"`), on raw bytes.
//
// HF stores the vocabulary and merges in the ByteLevel alphabet: each byte is shown as one printable
// character (GPT-2's bytes_to_unicode: '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF stand for
// themselves, the other 68 bytes for U+0100..U+0143). Here every vocabulary entry made only of those
// characters is mapped back to its bytes once at load, so encoding works on the text's bytes and
// the merge table is keyed by token ids.
//
// Merging follows HF's Word::merge_all: repeatedly merge the adjacent pair of lowest merge rank,
// the leftmost one among equal ranks, until no adjacent pair has a merge. With `ignore_merges`, a
// piece that is itself a vocabulary entry is that one token. Bytes without a vocabulary entry are
// dropped, as HF does when there is no unk_token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "worker/data/strings.h"

namespace ftd::data {

// GPT-2's byte <-> character map of the ByteLevel pre-tokenizer and decoder.
char32_t ByteLevelChar(uint8_t byte);
// The byte a ByteLevel character stands for, or -1 when `c` is not one of the 256.
int ByteLevelByte(char32_t c);

class BpeModel {
 public:
  // Reads `model` (the "model" object of tokenizer.json); refuses what this implementation does
  // not do (dropout, byte_fallback, subword prefixes/suffixes, an unk_token with missing bytes).
  absl::Status Load(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized piece (raw bytes).
  void EncodePiece(std::string_view piece, std::vector<uint32_t>* out) const;

  // The id of a vocabulary entry in its tokenizer.json (ByteLevel-alphabet) spelling.
  const uint32_t* FindText(std::string_view token) const;
  // Vocabulary size as HF counts it (entries in `vocab`), and the largest id + 1.
  size_t size() const { return text_to_id_.size(); }
  uint32_t id_limit() const { return static_cast<uint32_t>(id_to_text_.size()); }
  bool HasId(uint32_t id) const { return id < id_to_text_.size() && has_id_[id]; }
  const std::string& TextOf(uint32_t id) const { return id_to_text_[id]; }
  size_t num_merges() const { return merges_.size(); }
  bool ignore_merges() const { return ignore_merges_; }

  // The two merge algorithms, exposed for tests: both give HF's result; EncodePiece uses the
  // scan for short pieces and the heap for long ones.
  void MergeByScan(std::vector<uint32_t>* symbols) const;
  void MergeByHeap(std::vector<uint32_t>* symbols) const;
  static constexpr size_t kScanLimit = 128;  // symbols

 private:
  struct Merge {
    uint32_t rank;
    uint32_t id;
  };
  // The scan on arrays of capacity n: returns the merged length.
  size_t ScanMerge(uint32_t* s, uint32_t* rank, uint32_t* merged, size_t n) const;
  static uint64_t Key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
  const Merge* FindMerge(uint32_t a, uint32_t b) const {
    auto it = merges_.find(Key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  StringMap<uint32_t> text_to_id_;   // tokenizer.json spelling
  StringMap<uint32_t> bytes_to_id_;  // raw bytes, for entries in the alphabet
  std::vector<std::string> id_to_text_;
  std::vector<bool> has_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int64_t byte_id_[256];  // the id of each single byte, -1 when absent
  bool ignore_merges_ = false;
};

}  // namespace ftd::data
