// Training data: a token stream cut into windows of seq_len + 1 tokens, served as micro-batches.
// No LibTorch.
//
// Token file format (docs/data-format.md): a flat array of little-endian uint16 or uint32 token ids,
// no header. Window w covers tokens [w*(T+1), (w+1)*(T+1)); a trailing partial window is dropped.
// Micro-batch m of an epoch takes windows [m*B, (m+1)*B) of that epoch's order: file order without
// shuffle, otherwise a permutation drawn from (seed, epoch). Epochs hold floor(W / B) micro-batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/progress.h"
#include "worker/engine/spec_types.h"

namespace ftd::engine {

class TokenData {
 public:
  // Maps a token file, or generates the embedded dataset when cfg.path is empty. cfg.path must be
  // a regular file (a FIFO or device is refused at open). Reports kLoadData progress.
  static absl::StatusOr<std::unique_ptr<TokenData>> Open(const DataConfig& cfg, int64_t seq_len,
                                                         int64_t batch_size, int64_t vocab_size,
                                                         const ProgressFn& progress = {});
  ~TokenData();
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_windows() const { return num_windows_; }
  int64_t batches_per_epoch() const { return num_windows_ / batch_; }
  // Fills `out` (batch_size × (seq_len + 1), row-major) with global micro-batch `index`
  // (epoch = index / batches_per_epoch). Fails, naming the file, on an id >= vocab_size.
  absl::Status Batch(int64_t index, std::vector<int64_t>* out);

 private:
  TokenData() = default;
  int64_t Token(int64_t i) const;
  const std::vector<int64_t>& Order(int64_t epoch);

  std::string name_;
  DataConfig cfg_;
  int64_t seq_ = 0, batch_ = 0, vocab_ = 0;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<uint16_t> owned_;  // the embedded dataset
  const void* tokens_ = nullptr;
  int elem_size_ = 2;
  int64_t num_tokens_ = 0, num_windows_ = 0;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
};

// The embedded dataset: a small arithmetic language ("12+7=19;") over the alphabet below, one
// token per character, generated deterministically from `seed`. A model learns its format in a
// few dozen steps and the sums more slowly, so the loss falls visibly.
inline constexpr const char kArithmeticAlphabet[] = "0123456789+-=;";
std::vector<uint16_t> GenerateArithmetic(uint64_t seed, int64_t num_tokens);
std::string DecodeArithmetic(const std::vector<int64_t>& ids);

}  // namespace ftd::engine
