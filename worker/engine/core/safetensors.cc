#include "worker/engine/core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/engine/core/fs_util.h"

namespace ftd::engine {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeader = 100u << 20;  // the format's own limit on the JSON header

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

}  // namespace

absl::StatusOr<DType> DTypeFromName(std::string_view n) {
  static const std::pair<std::string_view, DType> kNames[] = {
      {"F64", DType::kF64}, {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
      {"I64", DType::kI64}, {"I32", DType::kI32}, {"I16", DType::kI16}, {"I8", DType::kI8},
      {"U8", DType::kU8},   {"U16", DType::kU16}, {"U32", DType::kU32}, {"BOOL", DType::kBool}};
  for (const auto& [name, d] : kNames) {
    if (name == n) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", std::string(n), "\""));
}

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF64: return "F64";
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kU16: return "U16";
    case DType::kU32: return "U32";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: case DType::kU16: return 2;
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto fd = OpenRegularFile(path, "");
  if (!fd.ok()) return fd.status();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return absl::InternalError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return Corrupt(path, absl::StrCat("truncated: ", size, " bytes, shorter than the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd->get(), 0);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;
  const auto* bytes = static_cast<const std::byte*>(map);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  if (n > kMaxHeader) return Corrupt(path, absl::StrCat("header length ", n, " exceeds the 100 MiB limit"));
  if (n > size - 8) {
    return Corrupt(path, absl::StrCat("truncated: header length ", n, " but only ", size - 8, " bytes follow"));
  }
  f->buffer_ = bytes + 8 + n;
  const uint64_t buffer_size = size - 8 - n;
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + 8 + n));
  } catch (const json::exception& e) {
    return Corrupt(path, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return Corrupt(path, "header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Corrupt(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return Corrupt(path, absl::StrCat("__metadata__.", m.key(), " is not a string"));
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](absl::string_view what) { return Corrupt(path, absl::StrCat("tensor \"", name, "\": ", what)); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      return bad("entry needs dtype, shape and data_offsets");
    }
    TensorInfo t;
    t.name = name;
    if (!v["dtype"].is_string()) return bad("dtype is not a string");
    auto d = DTypeFromName(v["dtype"].get<std::string>());
    if (!d.ok()) return bad(d.status().message());
    t.dtype = *d;
    if (!v["shape"].is_array()) return bad("shape is not an array");
    for (const auto& dim : v["shape"]) {
      if (!dim.is_number_unsigned()) return bad("shape holds a value that is not a non-negative integer");
      t.shape.push_back(dim.get<int64_t>());
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad("data_offsets must be [begin, end]");
    }
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.end < t.begin) return bad("data_offsets end before begin");
    if (t.end > buffer_size) {
      return bad(absl::StrCat("truncated: data ends at byte ", t.end, " of a ", buffer_size, "-byte buffer"));
    }
    const uint64_t want = static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype);
    if (want != t.end - t.begin) {
      return bad(absl::StrCat("shape and dtype need ", want, " bytes but data_offsets span ", t.end - t.begin));
    }
    f->tensors_.push_back(std::move(t));
  }
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : f->tensors_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->begin < sorted[i - 1]->end) {
      return Corrupt(path, absl::StrCat("tensor \"", sorted[i]->name, "\" overlaps \"", sorted[i - 1]->name, "\""));
    }
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsSet> SafetensorsSet::OpenDir(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsSet set;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::exists(index, ec)) {
    auto text = ReadRegularFile(index.string(), "");
    if (!text.ok()) return text.status();
    json j;
    try {
      j = json::parse(*text);
    } catch (const json::exception& e) {
      return absl::DataLossError(absl::StrCat(index.string(), ": not valid JSON: ", e.what()));
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::DataLossError(absl::StrCat(index.string(), ": weight_map is missing"));
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return absl::DataLossError(absl::StrCat(index.string(), ": weight_map.", it.key(), " is not a file name"));
      std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos) {
        return absl::DataLossError(absl::StrCat(index.string(), ": shard \"", file, "\" must be a plain file name"));
      }
      if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrCat("no model.safetensors or model.safetensors.index.json in ", dir));
  }
  for (const auto& file : files) {
    auto f = SafetensorsFile::Open((fs::path(dir) / file).string());
    if (!f.ok()) return f.status();
    std::shared_ptr<SafetensorsFile> shared = std::move(*f);
    for (const auto& t : shared->tensors()) {
      if (!set.index_.emplace(t.name, std::make_pair(shared.get(), &t)).second) {
        return absl::DataLossError(absl::StrCat("tensor \"", t.name, "\" appears in more than one shard of ", dir));
      }
    }
    set.files_.push_back(std::move(shared));
  }
  return set;
}

absl::StatusOr<std::pair<const SafetensorsFile*, const TensorInfo*>> SafetensorsSet::Find(
    std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return absl::NotFoundError(absl::StrCat("tensor \"", std::string(name), "\" is missing from the weights"));
  return it->second;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

uint64_t TensorToWrite::bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

absl::Status PwriteAll(int fd, const char* p, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(w < 0 ? errno : EIO)));
    p += w;
    n -= static_cast<uint64_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// Threads that pwrite() queued pieces at their offsets. The owner bounds how many are queued and
// takes back each finished piece (its staging slot and byte count) with Reap. Destruction skips what
// is still queued, waits for the writes under way and joins.
class PieceWriters {
 public:
  struct Piece {
    const char* data;
    uint64_t offset, n;
    int slot;  // staging buffer to give back, or -1
  };

  PieceWriters(int fd, const std::string& path, int threads) : fd_(fd), path_(path) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~PieceWriters() {
    {
      std::lock_guard<std::mutex> l(mu_);
      closing_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void Submit(const Piece& p) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(p);
      ++in_flight_;
    }
    work_cv_.notify_one();
  }
  int in_flight() const { return in_flight_; }  // only the owner changes it upwards
  // Skips the pieces still queued (a write that is stopping).
  void Drop() {
    std::lock_guard<std::mutex> l(mu_);
    dropping_ = true;
  }
  // Waits for at least one finished piece when `wait` (and any is in flight); returns the finished
  // pieces, and the first write error in *error.
  std::vector<Piece> Reap(bool wait, absl::Status* error) {
    std::unique_lock<std::mutex> l(mu_);
    if (wait) done_cv_.wait(l, [&] { return !done_.empty() || in_flight_ == 0; });
    std::vector<Piece> out(done_.begin(), done_.end());
    done_.clear();
    in_flight_ -= static_cast<int>(out.size());
    *error = error_;
    return out;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      work_cv_.wait(l, [&] { return closing_ || !queue_.empty(); });
      if (closing_) return;
      const Piece p = queue_.front();
      queue_.pop_front();
      const bool skip = dropping_ || !error_.ok();
      l.unlock();
      absl::Status s = skip ? absl::OkStatus() : PwriteAll(fd_, p.data, p.n, p.offset, path_);
      l.lock();
      if (!s.ok() && error_.ok()) error_ = std::move(s);
      done_.push_back(p);
      done_cv_.notify_all();
    }
  }

  const int fd_;
  const std::string& path_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Piece> queue_, done_;
  std::atomic<int> in_flight_{0};
  bool closing_ = false, dropping_ = false;
  absl::Status error_;
  std::vector<std::thread> threads_;
};

std::shared_ptr<void> AlignedAlloc(size_t bytes) {
  constexpr size_t kAlign = 4096;
  return std::shared_ptr<void>(std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign), std::free);
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata, const WriteOptions& options) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0, staged_max = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
    if (t.data == nullptr) {
      if (!options.fetch && t.bytes() > 0) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", t.name, "\" has no data"));
      }
      staged_max = std::max(staged_max, t.bytes());
    }
  }
  std::string h(8, '\0');
  h += header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the buffer to 8 bytes, as the reference writer does
  const uint64_t n = h.size() - 8;
  for (int i = 0; i < 8; ++i) h[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  auto created = CreateFile(path);
  if (!created.ok()) return created.status();
  Fd fd = std::move(*created);
  if (auto s = PwriteAll(fd.get(), h.data(), h.size(), 0, path); !s.ok()) return s;

  ProgressMeter* progress = options.progress;
  const uint64_t piece_bytes = std::max<uint64_t>(1, options.piece_bytes);
  const int max_in_flight = std::max(1, options.in_flight);
  // Staging buffers, each of min(piece, largest fetched tensor) bytes, made as they are first needed.
  // Declared before the writers: they outlive every write.
  std::vector<std::shared_ptr<void>> staging;
  std::vector<int> free_slots;
  absl::Status status, write_error;
  {
    PieceWriters writers(fd.get(), path, std::max(1, options.writers));
    auto reap = [&](bool wait) {
      for (const auto& p : writers.Reap(wait, &write_error)) {
        if (p.slot >= 0) free_slots.push_back(p.slot);
        if (progress != nullptr && write_error.ok()) progress->Add(p.n);
      }
      return write_error.ok();
    };
    uint64_t file_offset = h.size();
    for (size_t i = 0; i < tensors.size() && status.ok(); ++i) {
      const TensorToWrite& t = tensors[i];
      for (uint64_t done = 0, total = t.bytes(); done < total; done += std::min(piece_bytes, total - done)) {
        const uint64_t len = std::min(piece_bytes, total - done);
        if (!reap(false)) break;
        if (progress != nullptr && progress->Aborted()) {
          status = absl::CancelledError(absl::StrCat("write of ", path, " stopped"));
          break;
        }
        while (writers.in_flight() >= max_in_flight && reap(true)) {
        }
        if (!write_error.ok()) break;
        PieceWriters::Piece piece{nullptr, file_offset + done, len, -1};
        if (t.data != nullptr) {
          piece.data = static_cast<const char*>(t.data) + done;
        } else {
          if (free_slots.empty()) {
            staging.push_back(options.alloc ? options.alloc(std::min(piece_bytes, staged_max))
                                            : AlignedAlloc(std::min(piece_bytes, staged_max)));
            if (staging.back() == nullptr) {
              status = absl::ResourceExhaustedError(absl::StrCat(path, ": no memory for a staging buffer"));
              break;
            }
            free_slots.push_back(static_cast<int>(staging.size()) - 1);
          }
          piece.slot = free_slots.back();
          free_slots.pop_back();
          void* buf = staging[static_cast<size_t>(piece.slot)].get();
          if (auto s = options.fetch(i, done, len, buf); !s.ok()) {
            status = s;
            break;
          }
          piece.data = static_cast<const char*>(buf);
        }
        writers.Submit(piece);
      }
      file_offset += t.bytes();
      if (!write_error.ok()) break;
    }
    if (!status.ok() || !write_error.ok()) writers.Drop();
    while (writers.in_flight() > 0) reap(true);
  }
  if (status.ok()) status = write_error;
  if (!status.ok()) return status;
  if (progress != nullptr && progress->Aborted()) return absl::CancelledError(absl::StrCat("write of ", path, " stopped"));
  if (::fsync(fd.get()) != 0) return absl::InternalError(absl::StrCat("fsync ", path, ": ", std::strerror(errno)));
  if (::close(fd.release()) != 0) return absl::InternalError(absl::StrCat("close ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace ftd::engine
