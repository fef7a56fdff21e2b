// Reader and writer of the safetensors format (HF), with no LibTorch.
//
// Layout: u64 little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {"k": "v"}, "<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...}
// then the data buffer; offsets are relative to the buffer's start. The reader maps the file and
// checks everything before a tensor is handed out: header length within the file, JSON well formed,
// known dtype, shape × element size == byte length, offsets inside the buffer and not overlapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/core/progress.h"

namespace ftd::engine {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kU16, kU32, kBool };

absl::StatusOr<DType> DTypeFromName(std::string_view name);  // "F32", "BF16", ...
const char* DTypeName(DType d);
size_t DTypeSize(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
  int64_t numel() const;
};

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* Find(std::string_view name) const;
  const std::byte* data(const TensorInfo& t) const { return buffer_ + t.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const std::byte* buffer_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A model's weights: `dir/model.safetensors`, or the shards listed by
// `dir/model.safetensors.index.json` ({"weight_map": {"tensor": "file"}}).
class SafetensorsSet {
 public:
  static absl::StatusOr<SafetensorsSet> OpenDir(const std::string& dir);
  // The tensor and the file that holds it, or NotFound naming the tensor.
  absl::StatusOr<std::pair<const SafetensorsFile*, const TensorInfo*>> Find(std::string_view name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>, std::less<>> index_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel × DTypeSize(dtype) bytes, contiguous, valid until the write ends; or
                     // null: WriteOptions::fetch supplies them a piece at a time
  uint64_t bytes() const;  // numel × DTypeSize(dtype)
};

// Copies bytes [offset, offset + n) of tensors[index] (one whose `data` is null) into `staging`
// (n ≤ WriteOptions::piece_bytes). Called on the calling thread, pieces in file order, so that a
// caller copies one piece at a time off a device instead of holding host copies of whole tensors.
using PieceFetch = std::function<absl::Status(size_t index, uint64_t offset, uint64_t n, void* staging)>;
// Host memory of `bytes` for one staging buffer (pinned memory, for copies off a GPU).
using StagingAlloc = std::function<std::shared_ptr<void>(size_t bytes)>;

struct WriteOptions {
  ProgressMeter* progress = nullptr;  // counts data bytes once they are written; asked to abort per piece
  PieceFetch fetch;                   // for tensors whose `data` is null
  StagingAlloc alloc;                 // empty: page-aligned malloc
  uint64_t piece_bytes = 64u << 20;   // bytes per write; also each staging buffer's size
  int in_flight = 8;                  // pieces being filled or written at once (staging buffers)
  int writers = 4;                    // threads that pwrite() pieces at their offsets in the file
};

// Writes a .safetensors file (tensors in the order given) and fsyncs it once, at the end. The
// layout is fixed before any data is written, so the pieces go out in parallel: the calling thread
// fills staging buffers (fetch) while `writers` threads pwrite() the filled ones at their offsets.
// The bytes are those of a plain sequential write. Between pieces the write stops with CANCELLED
// when `progress` says to abort; any failure stops it too (what is in flight is waited for).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {},
                              const WriteOptions& options = {});

}  // namespace ftd::engine
