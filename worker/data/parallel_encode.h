// Encoding whole files in parallel: records (lines, JSONL fields, or any byte ranges) are cut into
// chunks of about 1 MB, threads take chunks in turn with one Encoder each, and the results are put
// back in record order. A progress bar shows on stderr when it is a terminal.
//
// The dataset code builds on RunChunks (its own per-record work, e.g. chat rendering with loss
// masks) or on the encoders below.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/tokenizer.h"

namespace ftd::data {

struct ParallelOptions {
  int threads = 0;                    // 0: every hardware thread
  bool progress = true;               // a bar on stderr, when it is a terminal
  std::string label = "tokenizing";   // the bar's label
  uint64_t chunk_bytes = 1 << 20;     // records per chunk: about this many bytes
  EncodeOptions encode;
};

int ResolveThreads(int threads);

// Chunks of consecutive records: chunk c is records [bounds[c], bounds[c+1]).
std::vector<size_t> ChunkBounds(std::span<const std::string_view> records, uint64_t chunk_bytes);

// Calls fn(encoder, c) for every chunk c in [0, chunk_bytes.size()) on `options.threads` threads,
// each thread with its own Encoder; chunk_bytes[c] is what chunk c adds to the progress bar.
// Returns the first error (in chunk order) after the threads stop; chunks after an error are not run.
absl::Status RunChunks(const Tokenizer& tokenizer, std::span<const uint64_t> chunk_bytes,
                       const ParallelOptions& options, const std::function<absl::Status(Encoder&, size_t)>& fn);

// Ids of many records, concatenated in record order.
struct EncodedRecords {
  std::vector<uint32_t> ids;
  std::vector<uint64_t> offsets{0};  // record r is ids[offsets[r], offsets[r + 1])
  size_t size() const { return offsets.size() - 1; }
  std::span<const uint32_t> operator[](size_t r) const {
    return std::span<const uint32_t>(ids).subspan(offsets[r], offsets[r + 1] - offsets[r]);
  }
};

absl::StatusOr<EncodedRecords> EncodeRecords(const Tokenizer& tokenizer, std::span<const std::string_view> records,
                                             const ParallelOptions& options);

// The lines of `text`: split at '\n', which is left out; a last line without '\n' counts when
// it is not empty. Other bytes ('\r' too) stay.
std::vector<std::string_view> SplitLines(std::string_view text);

// The lines of a JSONL file cut into chunks for RunChunks: chunk c is lines [bounds[c], bounds[c+1])
// and adds bytes[c] to the progress bar. A UTF-8 byte-order mark at the start of the file is not
// part of its first line (RFC 8259 lets a JSON parser ignore it): a file of only one is empty.
struct LineChunks {
  std::vector<std::string_view> lines;
  std::vector<size_t> bounds;
  std::vector<uint64_t> bytes;
  size_t size() const { return bytes.size(); }
};
LineChunks ChunkLines(std::string_view contents, uint64_t chunk_bytes);

// One JSON object per line; records are the string field `field`.
struct BadLine {
  uint64_t line;  // 1-based
  std::string reason;
};
struct EncodedJsonl {
  EncodedRecords records;
  std::vector<uint64_t> line_of;  // per record, its 1-based line number
  std::vector<BadLine> bad_lines;  // in line order: blank, not JSON, no such field, not a string
  uint64_t lines = 0;
};
absl::StatusOr<EncodedJsonl> EncodeJsonlField(const Tokenizer& tokenizer, std::string_view contents,
                                              std::string_view field, const ParallelOptions& options);
// "3 bad lines in data.jsonl (field \"text\"): line 2: not valid JSON (...); line 7: ...", the first five.
std::string DescribeBadLines(const std::vector<BadLine>& bad, std::string_view source);

// A file's bytes, memory-mapped read-only.
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  // The file `name` of the open directory `dir`, never through a link (O_NOFOLLOW); `path` names it
  // in errors. NOT_FOUND when it does not exist.
  static absl::StatusOr<MappedFile> OpenAt(int dir, const std::string& name, const std::string& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  ~MappedFile();
  std::string_view contents() const { return {static_cast<const char*>(data_), size_}; }

 private:
  MappedFile(void* data, size_t size) : data_(data), size_(size) {}
  static absl::StatusOr<MappedFile> Map(int fd, const std::string& path);  // takes fd
  void* data_;
  size_t size_;
};

}  // namespace ftd::data
