#include "worker/engine/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "worker/engine/fs_util.h"

namespace ftd::engine {

std::vector<uint16_t> GenerateArithmetic(uint64_t seed, int64_t num_tokens) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> out;
  out.reserve(static_cast<size_t>(num_tokens) + 16);
  auto emit = [&](const std::string& s) {
    for (char c : s) {
      const char* p = std::strchr(kArithmeticAlphabet, c);
      out.push_back(static_cast<uint16_t>(p - kArithmeticAlphabet));
    }
  };
  while (static_cast<int64_t>(out.size()) < num_tokens) {
    const uint64_t a = rng() % 100, b = rng() % 100;
    const bool add = (rng() & 1) != 0;
    const int64_t r = add ? static_cast<int64_t>(a + b) : static_cast<int64_t>(a) - static_cast<int64_t>(b);
    emit(absl::StrCat(a, add ? "+" : "-", b, "=", r, ";"));
  }
  out.resize(static_cast<size_t>(num_tokens));
  return out;
}

std::string DecodeArithmetic(const std::vector<int64_t>& ids) {
  std::string s;
  const int64_t n = static_cast<int64_t>(std::strlen(kArithmeticAlphabet));
  for (int64_t id : ids) s.push_back(id >= 0 && id < n ? kArithmeticAlphabet[id] : '?');
  return s;
}

absl::StatusOr<std::unique_ptr<TokenData>> TokenData::Open(const DataConfig& cfg, int64_t seq_len,
                                                           int64_t batch_size, int64_t vocab_size,
                                                           const ProgressFn& progress) {
  std::unique_ptr<TokenData> d(new TokenData());
  d->cfg_ = cfg;
  d->seq_ = seq_len;
  d->batch_ = batch_size;
  d->vocab_ = vocab_size;
  if (cfg.path.empty()) {
    d->name_ = "the embedded arithmetic dataset";
    // Enough windows for every batch shape we ship, at least 1M tokens.
    const int64_t n = std::max<int64_t>(1 << 20, 64 * batch_size * (seq_len + 1));
    ProgressMeter meter(progress, ProgressPhase::kLoadData, static_cast<uint64_t>(n) * 2);
    d->owned_ = GenerateArithmetic(cfg.seed, n);
    d->tokens_ = d->owned_.data();
    d->elem_size_ = 2;
    d->num_tokens_ = n;
    meter.Finish();
  } else {
    d->name_ = cfg.path;
    d->elem_size_ = cfg.token_dtype == "uint32" ? 4 : 2;
    auto fd = OpenRegularFile(cfg.path, "spec.data.path");
    if (!fd.ok()) {
      if (!absl::IsNotFound(fd.status())) return fd.status();
      return absl::NotFoundError(absl::StrCat(fd.status().message(),
                                              " (give an existing token file, or leave it unset for the embedded dataset)"));
    }
    struct stat st {};
    if (::fstat(fd->get(), &st) != 0) {
      return absl::InternalError(absl::StrCat("spec.data.path: stat ", cfg.path, ": ", std::strerror(errno)));
    }
    const auto size = static_cast<size_t>(st.st_size);
    ProgressMeter meter(progress, ProgressPhase::kLoadData, size);
    if (size % static_cast<size_t>(d->elem_size_) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("spec.data.path: ", cfg.path, " has ", size,
                                                     " bytes, not a multiple of ", d->elem_size_,
                                                     " (check spec.data.token_dtype)"));
    }
    if (size > 0) {
      d->map_ = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd->get(), 0);
      if (d->map_ == MAP_FAILED) {
        d->map_ = nullptr;
        return absl::InternalError(absl::StrCat("spec.data.path: mmap ", cfg.path, ": ", std::strerror(errno)));
      }
      d->map_size_ = size;
    }
    d->tokens_ = d->map_;
    d->num_tokens_ = static_cast<int64_t>(size) / d->elem_size_;
    meter.Finish();
  }
  d->num_windows_ = d->num_tokens_ / (seq_len + 1);
  if (d->num_windows_ < batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.data.path: ", d->name_, " holds ", d->num_tokens_, " tokens, fewer than one batch of ", batch_size,
        " windows of seq_len+1 = ", seq_len + 1, " tokens (use more data, or a smaller batch_size or seq_len)"));
  }
  return d;
}

TokenData::~TokenData() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

int64_t TokenData::Token(int64_t i) const {
  if (elem_size_ == 2) {
    uint16_t v;
    std::memcpy(&v, static_cast<const char*>(tokens_) + i * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, static_cast<const char*>(tokens_) + i * 4, 4);
  return v;
}

const std::vector<int64_t>& TokenData::Order(int64_t epoch) {
  if (order_epoch_ == epoch) return order_;
  order_.resize(static_cast<size_t>(num_windows_));
  for (int64_t i = 0; i < num_windows_; ++i) order_[static_cast<size_t>(i)] = i;
  if (cfg_.shuffle) {
    // Fisher-Yates with mt19937_64, whose output the C++ standard fixes: the same permutation on
    // every platform (std::shuffle's is implementation-defined).
    std::mt19937_64 rng(cfg_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
    for (int64_t i = num_windows_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
    }
  }
  order_epoch_ = epoch;
  return order_;
}

absl::Status TokenData::Batch(int64_t index, std::vector<int64_t>* out) {
  const int64_t per_epoch = batches_per_epoch();
  const auto& order = Order(index / per_epoch);
  const int64_t first = (index % per_epoch) * batch_;
  const int64_t w = seq_ + 1;
  out->resize(static_cast<size_t>(batch_ * w));
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t start = order[static_cast<size_t>(first + b)] * w;
    for (int64_t t = 0; t < w; ++t) {
      const int64_t id = Token(start + t);
      if (id >= vocab_) {
        return absl::InvalidArgumentError(absl::StrCat("spec.data.path: token ", start + t, " of ", name_, " is ", id,
                                                       ", outside the model's vocab_size ", vocab_,
                                                       " (check spec.data.token_dtype and the tokenizer)"));
      }
      (*out)[static_cast<size_t>(b * w + t)] = id;
    }
  }
  return absl::OkStatus();
}

}  // namespace ftd::engine
