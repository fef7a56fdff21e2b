// Small LibTorch helpers shared by the engine's translation units.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/core/fs_util.h"
#include "worker/engine/core/progress.h"
#include "worker/engine/core/safetensors.h"

namespace ftd::engine {

inline absl::StatusOr<torch::ScalarType> TorchDType(DType d) {
  switch (d) {
    case DType::kF32: return torch::kFloat;
    case DType::kF16: return torch::kHalf;
    case DType::kBF16: return torch::kBFloat16;
    case DType::kF64: return torch::kDouble;
    case DType::kI64: return torch::kInt64;
    case DType::kI32: return torch::kInt32;
    case DType::kU8: return torch::kUInt8;
    default: return absl::InvalidArgumentError(absl::StrCat("dtype ", DTypeName(d), " has no LibTorch mapping here"));
  }
}

inline absl::StatusOr<DType> SafetensorsDType(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return DType::kF32;
    case torch::kHalf: return DType::kF16;
    case torch::kBFloat16: return DType::kBF16;
    case torch::kDouble: return DType::kF64;
    case torch::kInt64: return DType::kI64;
    case torch::kInt32: return DType::kI32;
    case torch::kUInt8: return DType::kU8;
    default: return absl::InvalidArgumentError(absl::StrCat("tensor dtype ", c10::toString(t), " cannot be saved"));
  }
}

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Bytes of the tensors' data.
inline uint64_t TensorBytes(const NamedTensors& tensors) {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors) n += t.nbytes();
  return n;
}

// Writes named tensors, on any device, as one .safetensors file (in the order given; see
// WriteSafetensors for the parallel pieces). Host tensors are written from their own memory; device
// tensors are copied a piece at a time into staging buffers (pinned memory when on CUDA) while the
// pieces before are being written. With `produce`, the bytes written for tensor i are those of
// produce(i), made just before they are written (it must have tensors[i]'s dtype and shape): a
// derived tensor (a merged weight) exists one at a time too.
inline absl::Status WriteTensors(const std::string& path, const NamedTensors& tensors,
                                 const std::map<std::string, std::string>& metadata, ProgressMeter* progress,
                                 const std::function<torch::Tensor(size_t)>& produce = {}) {
  std::vector<TensorToWrite> out;
  out.reserve(tensors.size());
  bool on_cuda = false;
  for (const auto& [name, t] : tensors) {
    auto d = SafetensorsDType(t.scalar_type());
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("\"", name, "\": ", d.status().message()));
    const bool direct = !produce && t.device().is_cpu() && t.is_contiguous();
    out.push_back({name, *d, t.sizes().vec(), direct ? t.data_ptr() : nullptr});
    on_cuda = on_cuda || t.device().is_cuda();
  }
  size_t current = tensors.size();
  torch::Tensor bytes;  // the tensor being fetched, flat, as bytes
  WriteOptions options;
  options.progress = progress;
  options.fetch = [&](size_t i, uint64_t offset, uint64_t n, void* staging) -> absl::Status {
    if (i != current) {
      torch::Tensor t = produce ? produce(i) : tensors[i].second;
      if (t.scalar_type() != tensors[i].second.scalar_type() || t.sizes() != tensors[i].second.sizes()) {
        return absl::InternalError(
            absl::StrCat("\"", tensors[i].first, "\": the tensor to write changed dtype or shape"));
      }
      bytes = t.detach().contiguous().reshape({-1}).view(torch::kUInt8);
      current = i;
    }
    torch::from_blob(staging, {static_cast<int64_t>(n)}, torch::TensorOptions().dtype(torch::kUInt8))
        .copy_(bytes.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(n)));
    return absl::OkStatus();
  };
  if (on_cuda) {
    // Pinned: the copy off the GPU is a DMA at the link's rate. LibTorch's host allocator caches the
    // buffers for the next checkpoint.
    options.alloc = [](size_t n) -> std::shared_ptr<void> {
      torch::Tensor t = torch::empty({static_cast<int64_t>(n)}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
      return std::shared_ptr<void>(t.data_ptr(), [t](void*) mutable { t.reset(); });
    };
  }
  return WriteSafetensors(path, out, metadata, options);
}

inline std::string ShapeString(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace ftd::engine
