#include "worker/engine/core/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spec/input_files.h"
#include "worker/data/dataset_cache.h"
#include "worker/engine/core/fs_util.h"

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

absl::StatusOr<data::PrepareRequest> PrepareRequestFor(const DataConfig& cfg, const std::string& path) {
  data::PrepareRequest req;
  req.path = path;
  req.tokenizer_dir = cfg.tokenizer_path;
  auto kind = data::JsonlFormat::ParseKind(cfg.format);
  if (!kind.ok()) return kind.status();
  req.format.kind = *kind;
  req.format.text_field = cfg.text_field;
  req.format.prompt_field = cfg.prompt_field;
  req.format.completion_field = cfg.completion_field;
  req.format.messages_field = cfg.messages_field;
  req.format.role_field = cfg.role_field;
  req.format.content_field = cfg.content_field;
  req.format.skip_bad_lines = cfg.on_bad_line == "skip";
  req.cache_dir = cfg.cache_dir;
  return req;
}

std::unique_ptr<TokenData> TokenData::Make(const DataConfig& cfg, int64_t seq_len, int64_t batch_size,
                                           int64_t vocab_size) {
  std::unique_ptr<TokenData> d(new TokenData());
  d->seq_ = seq_len;
  d->batch_ = batch_size;
  d->vocab_ = vocab_size;
  d->pad_ = cfg.sequence == "pad";
  d->shuffle_ = cfg.shuffle;
  d->seed_ = cfg.seed;
  return d;
}

absl::StatusOr<std::unique_ptr<TokenData>> TokenData::Open(const DataConfig& cfg, int64_t seq_len,
                                                           int64_t batch_size, int64_t vocab_size,
                                                           const ProgressFn& progress, Split split) {
  auto d = Make(cfg, seq_len, batch_size, vocab_size);
  const bool eval_file = split == Split::kEval && !cfg.eval_path.empty();
  if (auto s = d->Load(cfg, eval_file ? cfg.eval_path : cfg.path, progress); !s.ok()) return s;
  return Finish(std::move(d), cfg, split, eval_file);
}

absl::StatusOr<std::unique_ptr<TokenData>> TokenData::FromCorpus(data::Corpus corpus, const DataConfig& cfg,
                                                                 int64_t seq_len, int64_t batch_size,
                                                                 int64_t vocab_size, Split split) {
  auto d = Make(cfg, seq_len, batch_size, vocab_size);
  d->name_ = "the corpus";
  d->quote_ = MayQuoteContents(cfg.path);
  d->Adopt(std::move(corpus));
  return Finish(std::move(d), cfg, split, /*eval_file=*/false);
}

absl::StatusOr<std::unique_ptr<TokenData>> TokenData::Finish(std::unique_ptr<TokenData> d, const DataConfig& cfg,
                                                             Split split, bool eval_file) {
  const int64_t seq_len = d->seq_, batch_size = d->batch_;
  if (auto s = d->CheckVocab(); !s.ok()) return s;
  d->BuildRows(cfg, eval_file ? Split::kTrain : split);  // an eval file is all held-out rows
  const std::string field = eval_file ? "spec.data.eval_path" : "spec.data.path";
  if (split == Split::kEval && d->num_rows() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", d->name_, " gives no held-out row of seq_len+1 = ", seq_len + 1,
        " tokens (use more data, a larger data.eval_fraction or a smaller seq_len)"));
  }
  if (split == Split::kTrain && d->num_rows() < batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", d->name_, " gives ", d->num_rows(), " training rows (", d->num_tokens_, " tokens), fewer than one batch of ",
        batch_size, " rows of seq_len+1 = ", seq_len + 1,
        " tokens (use more data, or a smaller batch_size or seq_len)"));
  }
  return d;
}

void TokenData::Adopt(data::Corpus&& c) {
  owned32_ = std::move(c.ids);
  owned_loss_ = std::move(c.loss);
  docs_ = std::move(c.docs);
  tokens_ = owned32_.data();
  loss_ = owned_loss_.data();
  elem_size_ = 4;
  num_tokens_ = static_cast<int64_t>(owned32_.size());
}

void TokenData::KeepDocuments(const std::vector<bool>& keep) {
  size_t out = 0;
  std::vector<uint64_t> docs{0};
  for (size_t d = 0; d + 1 < docs_.size(); ++d) {
    if (!keep[d]) continue;
    for (uint64_t i = docs_[d]; i < docs_[d + 1]; ++i, ++out) {
      owned32_[out] = owned32_[i];
      owned_loss_[out] = owned_loss_[i];
    }
    docs.push_back(out);
  }
  owned32_.resize(out);
  owned_loss_.resize(out);
  docs_ = std::move(docs);
  tokens_ = owned32_.data();
  loss_ = owned_loss_.data();
  num_tokens_ = static_cast<int64_t>(out);
}

absl::Status TokenData::Load(const DataConfig& cfg, const std::string& path, const ProgressFn& progress) {
  const std::string field = path == cfg.path ? "spec.data.path" : "spec.data.eval_path";
  if (path.empty()) {
    name_ = "the embedded arithmetic dataset";
    // Enough windows for every batch shape we ship, at least 1M tokens.
    const int64_t n = std::max<int64_t>(1 << 20, 64 * batch_ * (seq_ + 1));
    ProgressMeter meter(progress, ProgressPhase::kLoadData, static_cast<uint64_t>(n) * 2);
    owned16_ = GenerateArithmetic(cfg.seed, n);
    tokens_ = owned16_.data();
    elem_size_ = 2;
    num_tokens_ = n;
    meter.Finish();
    summary_ = absl::StrCat(name_, ": ", n, " tokens");
    return absl::OkStatus();
  }
  name_ = path;
  quote_ = MayQuoteContents(path);
  auto fd = OpenRegularFile(path, field);
  if (!fd.ok()) {
    if (!absl::IsNotFound(fd.status())) return fd.status();
    return absl::NotFoundError(absl::StrCat(fd.status().message(),
                                            cfg.jsonl() ? " (give an existing JSONL file)"
                                                        : " (give an existing token file, or leave it unset for the embedded dataset)"));
  }
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) {
    return absl::InternalError(absl::StrCat(field, ": stat ", path, ": ", std::strerror(errno)));
  }
  const auto size = static_cast<size_t>(st.st_size);
  ProgressMeter meter(progress, ProgressPhase::kLoadData, size);
  if (cfg.jsonl()) {
    auto req = PrepareRequestFor(cfg, path);
    if (!req.ok()) return req.status();
    req->parallel.progress = false;
    auto prepared = data::PrepareJsonl(*req);
    if (!prepared.ok()) return prepared.status();
    data::Corpus& c = prepared->corpus;
    const uint64_t bad_line_count = c.bad_line_count;
    const std::string bad_lines_summary = c.bad_lines_summary;
    Adopt(std::move(c));
    uint64_t counted = 0;
    for (uint8_t l : owned_loss_) counted += l;
    summary_ = absl::StrFormat("%s (%s): %d examples, %d tokens, %.1f%% of them masked from the loss%s; %s %s",
                               path, cfg.format, docs_.size() - 1, num_tokens_,
                               num_tokens_ > 0 ? 100.0 * static_cast<double>(num_tokens_ - static_cast<int64_t>(counted)) /
                                                     static_cast<double>(num_tokens_)
                                               : 0.0,
                               bad_line_count > 0 ? absl::StrCat("; skipped ", bad_lines_summary) : "",
                               prepared->reused ? "reused" : "tokenized into",
                               prepared->cache_error.empty() ? prepared->dir
                                                             : absl::StrCat("memory (not cached: ", prepared->cache_error, ")"));
    meter.Finish();
    return absl::OkStatus();
  }
  // A JSONL file given as a token file (data.format left at "tokens") would train on its bytes as
  // ids, or fail on the first one above the vocabulary: say what it is (the check ftd makes at submit).
  std::string head(std::min(size, spec::kJsonSniffBytes), '\0');
  if (!head.empty()) {
    const ssize_t n = ::pread(fd->get(), head.data(), head.size(), 0);
    head.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  if (spec::LooksLikeJsonLines(head, head.size() == size)) return spec::JsonLinesAsTokensError(field, path);
  elem_size_ = cfg.token_dtype == "uint32" ? 4 : 2;
  if (size % static_cast<size_t>(elem_size_) != 0) {
    // No size, no content: the message may reach a caller who may not read the file.
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " is not a valid token file: its size is not a "
                                                   "multiple of ", elem_size_, " bytes (check spec.data.token_dtype)"));
  }
  if (size > 0) {
    map_ = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd->get(), 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      return absl::InternalError(absl::StrCat(field, ": mmap ", path, ": ", std::strerror(errno)));
    }
    map_size_ = size;
  }
  tokens_ = map_;
  num_tokens_ = static_cast<int64_t>(size) / elem_size_;
  meter.Finish();
  summary_ = absl::StrCat(path, ": ", num_tokens_, " tokens");
  return absl::OkStatus();
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

absl::Status TokenData::CheckVocab() const {
  for (int64_t i = 0; i < num_tokens_; ++i) {
    const int64_t id = Token(i);
    if (id < vocab_) continue;
    std::string what = "it holds ids";
    // The id and where it is are the file's bytes: named only where the caller may read the file.
    if (quote_) {
      what = absl::StrCat("token ", i);
      if (!docs_.empty()) {
        const auto doc = std::upper_bound(docs_.begin(), docs_.end(), static_cast<uint64_t>(i)) - docs_.begin();
        absl::StrAppend(&what, " (in example ", doc, ")");
      }
      absl::StrAppend(&what, " is id ", id, ",");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        name_, " is not a valid token file for this model: ", what, " outside the model's vocab_size ", vocab_,
        docs_.empty() ? " (check spec.data.token_dtype and the tokenizer that wrote the file)"
                      : " (the tokenizer in spec.data.tokenizer_path does not match the model)"));
  }
  return absl::OkStatus();
}

void TokenData::BuildRows(const DataConfig& cfg, Split split) {
  const int64_t w = seq_ + 1;
  int64_t total = 0;
  if (pad_ && !docs_.empty()) {
    total = static_cast<int64_t>(docs_.size()) - 1;
    for (int64_t r = 0; r < total; ++r) {
      truncated_ += static_cast<int64_t>(docs_[static_cast<size_t>(r) + 1] - docs_[static_cast<size_t>(r)]) > w;
    }
  } else {
    total = num_tokens_ / w;  // a token file is one document: pad and pack cut the same windows
  }
  // Held-out data: each document (pack with documents), else each row, drawn from the seed with
  // probability eval_fraction.
  std::mt19937_64 rng(cfg.seed ^ 0xE7A1D47A5EEDULL);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  if (!pad_ && !docs_.empty() && cfg.eval_fraction > 0) {
    // Split before packing: a window never holds a document's tail on one side and its head on the other.
    std::vector<bool> keep(docs_.size() - 1);
    for (size_t d = 0; d < keep.size(); ++d) keep[d] = (u(rng) < cfg.eval_fraction) == (split == Split::kEval);
    KeepDocuments(keep);
    absl::StrAppend(&summary_, "; ", split == Split::kEval ? "held out: " : "training on: ", docs_.size() - 1,
                    " documents, ", num_tokens_, " tokens");
    for (int64_t r = 0; r < num_tokens_ / w; ++r) rows_.push_back(r);
    return;
  }
  for (int64_t r = 0; r < total; ++r) {
    const bool held_out = cfg.eval_fraction > 0 && u(rng) < cfg.eval_fraction;
    if (held_out == (split == Split::kEval)) rows_.push_back(r);
  }
  if (pad_ && !docs_.empty()) absl::StrAppend(&summary_, "; ", truncated_, " examples truncated to seq_len+1 = ", w);
}

const std::vector<int64_t>& TokenData::Order(int64_t epoch) {
  if (order_epoch_ == epoch) return order_;
  order_ = rows_;
  const auto n = static_cast<int64_t>(order_.size());
  if (shuffle_) {
    // Fisher-Yates with mt19937_64, whose output the C++ standard fixes: the same permutation on
    // every platform (std::shuffle's is implementation-defined).
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
    }
  }
  order_epoch_ = epoch;
  return order_;
}

void TokenData::FillRow(int64_t row, int64_t b, MicroBatch* out) const {
  const int64_t w = seq_ + 1, T = seq_;
  int64_t start = 0, n = 0;
  if (pad_ && !docs_.empty()) {
    start = static_cast<int64_t>(docs_[static_cast<size_t>(row)]);
    n = std::min<int64_t>(static_cast<int64_t>(docs_[static_cast<size_t>(row) + 1]) - start, w);
  } else {
    start = row * w;
    n = w;
  }
  // The document holding `start` and where the next one begins.
  size_t k = 0;
  int64_t next = std::numeric_limits<int64_t>::max();
  if (!docs_.empty()) {
    k = static_cast<size_t>(std::upper_bound(docs_.begin(), docs_.end(), static_cast<uint64_t>(start)) - docs_.begin()) - 1;
    next = static_cast<int64_t>(docs_[k + 1]);
  }
  int64_t seg = 0, doc_start = start;
  const size_t base = static_cast<size_t>(b * T);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = start + t;
    const size_t o = base + static_cast<size_t>(t);
    if (t < n) {
      while (p >= next) {
        ++k;
        next = static_cast<int64_t>(docs_[k + 1]);
        ++seg;
        doc_start = p;
      }
      out->input_ids[o] = Token(p);
      ++out->real_tokens;
    } else {
      out->input_ids[o] = 0;  // padding: after every real token, so causal attention never reaches it
    }
    out->positions[o] = t < n ? p - doc_start : t;  // padding exists only in pad rows: one document from 0
    out->segments[o] = seg;
    const int64_t q = p + 1;
    if (t + 1 < n && q < next && Counted(q)) {
      out->labels[o] = Token(q);
      ++out->loss_tokens;
    } else {
      out->labels[o] = kLabelIgnored;
    }
  }
  if (seg > 0) out->multi_document = true;
}

void TokenData::FillRows(const int64_t* rows, int64_t count, MicroBatch* out) const {
  out->rows = count;
  out->seq = seq_;
  const auto size = static_cast<size_t>(count * seq_);
  out->input_ids.resize(size);
  out->labels.resize(size);
  out->positions.resize(size);
  out->segments.resize(size);
  out->multi_document = false;
  out->real_tokens = out->loss_tokens = 0;
  for (int64_t b = 0; b < count; ++b) FillRow(rows[b], b, out);
}

void TokenData::Rows(int64_t first, int64_t count, MicroBatch* out) const {
  FillRows(rows_.data() + first, count, out);
}

void TokenData::Batch(int64_t index, MicroBatch* out, int64_t part, int64_t parts) {
  const int64_t per_epoch = batches_per_epoch();
  const auto& order = Order(index / per_epoch);
  const int64_t rows = batch_ / parts;
  FillRows(order.data() + (index % per_epoch) * batch_ + part * rows, rows, out);
}

}  // namespace ftd::engine
