#include "worker/data/parallel_encode.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/data/confined_open.h"
#include "worker/data/progress.h"

namespace ftd::data {

int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

std::vector<size_t> ChunkBounds(std::span<const std::string_view> records, uint64_t chunk_bytes) {
  std::vector<size_t> bounds{0};
  uint64_t bytes = 0;
  for (size_t r = 0; r < records.size(); ++r) {
    bytes += records[r].size() + 1;
    if (bytes >= chunk_bytes) {
      bounds.push_back(r + 1);
      bytes = 0;
    }
  }
  if (bounds.back() != records.size()) bounds.push_back(records.size());
  return bounds;
}

absl::Status RunChunks(const Tokenizer& tokenizer, std::span<const uint64_t> chunk_bytes,
                       const ParallelOptions& options, const std::function<absl::Status(Encoder&, size_t)>& fn) {
  const size_t chunks = chunk_bytes.size();
  uint64_t total = 0;
  for (uint64_t b : chunk_bytes) total += b;
  Progress progress(options.label, total, options.progress);
  const int threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(ResolveThreads(options.threads)),
                                                        std::max<size_t>(chunks, 1)));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<absl::Status> status(chunks);
  std::mutex mu;
  std::condition_variable cv;
  int running = threads;
  auto worker = [&] {
    Encoder encoder(tokenizer);
    for (size_t c; !failed.load(std::memory_order_relaxed) && (c = next.fetch_add(1)) < chunks;) {
      status[c] = fn(encoder, c);
      if (!status[c].ok()) failed.store(true);
      progress.Add(chunk_bytes[c]);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (--running == 0) cv.notify_all();
  };
  if (threads == 1 && !progress.active()) {
    worker();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
    {
      std::unique_lock<std::mutex> lock(mu);
      while (running > 0) {
        cv.wait_for(lock, std::chrono::milliseconds(200));
        progress.Draw();
      }
    }
    for (auto& th : pool) th.join();
  }
  progress.Finish();
  for (const absl::Status& st : status) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

namespace {

// Concatenates per-chunk results in chunk order.
void Append(EncodedRecords&& part, EncodedRecords* all) {
  const uint64_t base = all->ids.size();
  all->ids.insert(all->ids.end(), part.ids.begin(), part.ids.end());
  for (size_t r = 1; r < part.offsets.size(); ++r) all->offsets.push_back(base + part.offsets[r]);
}

}  // namespace

absl::StatusOr<EncodedRecords> EncodeRecords(const Tokenizer& tokenizer, std::span<const std::string_view> records,
                                             const ParallelOptions& options) {
  const std::vector<size_t> bounds = ChunkBounds(records, options.chunk_bytes);
  const size_t chunks = bounds.size() - 1;
  std::vector<uint64_t> bytes(chunks, 0);
  for (size_t c = 0; c < chunks; ++c) {
    for (size_t r = bounds[c]; r < bounds[c + 1]; ++r) bytes[c] += records[r].size();
  }
  std::vector<EncodedRecords> parts(chunks);
  auto st = RunChunks(tokenizer, bytes, options, [&](Encoder& enc, size_t c) -> absl::Status {
    EncodedRecords& out = parts[c];
    for (size_t r = bounds[c]; r < bounds[c + 1]; ++r) {
      if (auto s = enc.Encode(records[r], &out.ids, options.encode); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("record ", r + 1, ": ", s.message()));
      }
      out.offsets.push_back(out.ids.size());
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  EncodedRecords all;
  size_t total = 0;
  for (const auto& p : parts) total += p.ids.size();
  all.ids.reserve(total);
  all.offsets.reserve(records.size() + 1);
  for (auto& p : parts) Append(std::move(p), &all);
  return all;
}

std::vector<std::string_view> SplitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    const void* nl = std::memchr(text.data() + start, '\n', text.size() - start);
    const size_t end = nl ? static_cast<size_t>(static_cast<const char*>(nl) - text.data()) : text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

LineChunks ChunkLines(std::string_view contents, uint64_t chunk_bytes) {
  LineChunks lc;
  if (contents.starts_with("\xEF\xBB\xBF")) contents.remove_prefix(3);
  lc.lines = SplitLines(contents);
  lc.bounds = ChunkBounds(lc.lines, chunk_bytes);
  lc.bytes.assign(lc.bounds.size() - 1, 0);
  for (size_t c = 0; c + 1 < lc.bounds.size(); ++c) {
    for (size_t r = lc.bounds[c]; r < lc.bounds[c + 1]; ++r) lc.bytes[c] += lc.lines[r].size() + 1;
  }
  return lc;
}

absl::StatusOr<EncodedJsonl> EncodeJsonlField(const Tokenizer& tokenizer, std::string_view contents,
                                              std::string_view field, const ParallelOptions& options) {
  const LineChunks lc = ChunkLines(contents, options.chunk_bytes);
  const auto& lines = lc.lines;
  const auto& bounds = lc.bounds;
  const size_t chunks = lc.size();
  struct Part {
    EncodedRecords records;
    std::vector<uint64_t> line_of;
    std::vector<BadLine> bad;
  };
  std::vector<Part> parts(chunks);
  const std::string key(field);
  auto st = RunChunks(tokenizer, lc.bytes, options, [&](Encoder& enc, size_t c) -> absl::Status {
    Part& out = parts[c];
    for (size_t r = bounds[c]; r < bounds[c + 1]; ++r) {
      const uint64_t line_no = r + 1;
      const std::string_view line = lines[r];
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
        out.bad.push_back({line_no, "blank line"});
        continue;
      }
      nlohmann::json doc;
      try {
        doc = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error&) {
        out.bad.push_back({line_no, "not valid JSON"});  // the parser's message quotes the line
        continue;
      }
      if (!doc.is_object()) {
        out.bad.push_back({line_no, "not a JSON object"});
        continue;
      }
      auto it = doc.find(key);
      if (it == doc.end()) {
        out.bad.push_back({line_no, absl::StrCat("no field \"", key, "\"")});
        continue;
      }
      if (!it->is_string()) {
        out.bad.push_back({line_no, absl::StrCat("field \"", key, "\" is ", it->type_name(), ", not a string")});
        continue;
      }
      if (auto s = enc.Encode(it->get_ref<const std::string&>(), &out.records.ids, options.encode); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("line ", line_no, ": ", s.message()));
      }
      out.records.offsets.push_back(out.records.ids.size());
      out.line_of.push_back(line_no);
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  EncodedJsonl all;
  all.lines = lines.size();
  for (auto& p : parts) {
    Append(std::move(p.records), &all.records);
    all.line_of.insert(all.line_of.end(), p.line_of.begin(), p.line_of.end());
    all.bad_lines.insert(all.bad_lines.end(), p.bad.begin(), p.bad.end());
  }
  return all;
}

std::string DescribeBadLines(const std::vector<BadLine>& bad, std::string_view source) {
  std::string out = absl::StrFormat("%d bad line%s in %s", bad.size(), bad.size() == 1 ? "" : "s", source);
  for (size_t i = 0; i < bad.size() && i < 5; ++i) {
    absl::StrAppend(&out, i == 0 ? ": " : "; ", "line ", bad[i].line, ": ", bad[i].reason);
  }
  if (bad.size() > 5) absl::StrAppend(&out, "; ...");
  return out;
}

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  // Beneath the job's roots when the worker is confined: a link out of them is refused. O_NONBLOCK:
  // a FIFO must not hang the open (it is refused below).
  const int fd = OpenConfined(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0, /*write=*/false);
  if (fd < 0) {
    const int e = errno;
    const std::string msg = OpenError("", "cannot open", path, e, /*write=*/false);
    return e == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  return Map(fd, path);
}

absl::StatusOr<MappedFile> MappedFile::OpenAt(int dir, const std::string& name, const std::string& path) {
  const int fd = ::openat(dir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
  if (fd < 0) {
    const int e = errno;
    const std::string msg = absl::StrCat("cannot open ", path, ": ",
                                         e == ELOOP ? "it is a symbolic link" : std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  return Map(fd, path);
}

absl::StatusOr<MappedFile> MappedFile::Map(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot map ", path, ": ", std::strerror(err)));
    }
    ::madvise(data, size, MADV_SEQUENTIAL);
  }
  ::close(fd);
  return MappedFile(data, size);
}

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace ftd::data
