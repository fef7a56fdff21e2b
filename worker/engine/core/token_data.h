// Training data: a token stream with a loss mask and document boundaries, cut into rows of
// seq_len + 1 tokens and served as micro-batches of inputs, labels and positions. No LibTorch.
//
// Sources (docs/data-format.md): a token file (a flat array of little-endian uint16 or uint32 ids,
// no header: one document, every token counted), a JSONL file tokenized with the model's tokenizer
// (worker/data/dataset.h: documents with loss masks, through the prepared-dataset cache), or the
// embedded arithmetic dataset.
//
// Rows (data.sequence):
//   pack: row r is the stream's tokens [r*(T+1), (r+1)*(T+1)); a trailing partial row is dropped.
//         Positions restart at 0 at every document start, and `segments` numbers the documents of
//         a row so attention stays inside each one (a block-diagonal causal mask).
//   pad:  row r is document r's first T+1 tokens (longer documents are truncated and counted),
//         padded with id 0; padding is never attended to by real tokens and never a label.
// The label of position t is the row's token t+1 when it is in the same document and its loss
// mask counts it, else -100. Held-out data (data.eval_fraction) is drawn from the seed per document
// where there are documents (JSONL: before packing, so that no document has tokens on both sides),
// else per row (a token file or the embedded dataset: one document).
// Micro-batch m of an epoch takes rows [m*B, (m+1)*B) of that epoch's order: row order without
// shuffle, otherwise a permutation drawn from (seed, epoch). Epochs hold floor(R / B) micro-batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/dataset_cache.h"
#include "worker/engine/core/progress.h"
#include "worker/engine/spec_types.h"

namespace ftd::engine {

inline constexpr int64_t kLabelIgnored = -100;

// rows × seq tensors, row-major.
struct MicroBatch {
  int64_t rows = 0, seq = 0;
  std::vector<int64_t> input_ids, labels, positions;
  std::vector<int64_t> segments;  // per position, its document's index within the row
  bool multi_document = false;    // some row holds more than one document (positions and mask matter)
  int64_t real_tokens = 0;        // inputs that are not padding
  int64_t loss_tokens = 0;        // labels that are not -100
};

class TokenData {
 public:
  enum class Split { kTrain, kEval };
  // Opens cfg.path (format tokens or JSONL, tokenized with cfg.tokenizer_path), or generates the
  // embedded dataset when cfg.path is empty; kEval opens cfg.eval_path, or cfg.path's held-out
  // rows. Paths must be regular files. Every id is checked against vocab_size here, before any
  // training: an id >= vocab_size is refused naming the id, where it is and the vocab size.
  // Reports kLoadData progress.
  static absl::StatusOr<std::unique_ptr<TokenData>> Open(const DataConfig& cfg, int64_t seq_len,
                                                         int64_t batch_size, int64_t vocab_size,
                                                         const ProgressFn& progress = {}, Split split = Split::kTrain);
  // The same from a tokenized corpus in memory (what a JSONL file gives).
  static absl::StatusOr<std::unique_ptr<TokenData>> FromCorpus(data::Corpus corpus, const DataConfig& cfg,
                                                               int64_t seq_len, int64_t batch_size,
                                                               int64_t vocab_size, Split split = Split::kTrain);
  ~TokenData();
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_rows() const { return static_cast<int64_t>(rows_.size()); }
  int64_t num_windows() const { return num_rows(); }
  int64_t batches_per_epoch() const { return num_rows() / batch_; }
  // One line for the log: documents, tokens, masked fraction, bad lines skipped, truncations.
  const std::string& summary() const { return summary_; }
  int64_t truncated_documents() const { return truncated_; }

  // Global micro-batch `index` (epoch = index / batches_per_epoch). With parts > 1 (data-parallel
  // ranks, batch_size a multiple of parts), only part `part` of it: its rows
  // [part * batch_size / parts, (part + 1) * batch_size / parts), so the parts together are the
  // micro-batch a single process would take.
  void Batch(int64_t index, MicroBatch* out, int64_t part = 0, int64_t parts = 1);
  // Rows [first, first + count) in row order (no shuffle): the held-out set, batch by batch.
  void Rows(int64_t first, int64_t count, MicroBatch* out) const;

 private:
  TokenData() = default;
  static std::unique_ptr<TokenData> Make(const DataConfig& cfg, int64_t seq_len, int64_t batch_size, int64_t vocab_size);
  // Checks the ids, builds the split's rows and refuses too few of them.
  static absl::StatusOr<std::unique_ptr<TokenData>> Finish(std::unique_ptr<TokenData> d, const DataConfig& cfg,
                                                           Split split, bool eval_file);
  void Adopt(data::Corpus&& c);
  // Keeps only the documents `keep` says yes to, in order (ids, loss mask and boundaries).
  void KeepDocuments(const std::vector<bool>& keep);
  absl::Status Load(const DataConfig& cfg, const std::string& path, const ProgressFn& progress);
  absl::Status CheckVocab() const;
  void BuildRows(const DataConfig& cfg, Split split);
  int64_t Token(int64_t i) const;
  bool Counted(int64_t i) const { return loss_ == nullptr || loss_[i] != 0; }
  const std::vector<int64_t>& Order(int64_t epoch);
  void FillRow(int64_t row, int64_t b, MicroBatch* out) const;
  void FillRows(const int64_t* rows, int64_t count, MicroBatch* out) const;

  std::string name_;
  bool quote_ = true;  // errors may name ids and positions (MayQuoteContents)
  bool pad_ = false, shuffle_ = false;
  uint64_t seed_ = 0;
  int64_t seq_ = 0, batch_ = 0, vocab_ = 0;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<uint16_t> owned16_;   // the embedded dataset
  std::vector<uint32_t> owned32_;   // a tokenized JSONL file
  std::vector<uint8_t> owned_loss_;
  std::vector<uint64_t> docs_;      // document starts and the end; empty: one document
  const void* tokens_ = nullptr;
  const uint8_t* loss_ = nullptr;   // nullptr: every token counted
  int elem_size_ = 2;
  int64_t num_tokens_ = 0, truncated_ = 0;
  std::vector<int64_t> rows_;       // the split's rows (pack: window index; pad: document index)
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
  std::string summary_;
};

// The prepared-dataset request for a JSONL file `path` (cfg.path or cfg.eval_path) under `cfg`;
// cfg.tokenizer_path must already be resolved (the trainer falls back to model.weights_path).
absl::StatusOr<data::PrepareRequest> PrepareRequestFor(const DataConfig& cfg, const std::string& path);

// The embedded dataset: a small arithmetic language ("12+7=19;") over the alphabet below, one
// token per character, generated deterministically from `seed`. A model learns its format in a
// few dozen steps and the sums more slowly, so the loss falls visibly.
inline constexpr const char kArithmeticAlphabet[] = "0123456789+-=;";
std::vector<uint16_t> GenerateArithmetic(uint64_t seed, int64_t num_tokens);
std::string DecodeArithmetic(const std::vector<int64_t>& ids);

}  // namespace ftd::engine
