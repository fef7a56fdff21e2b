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
#include "worker/engine/fs_util.h"
#include "worker/engine/progress.h"
#include "worker/engine/safetensors.h"

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

// Writes named tensors, on any device, as one .safetensors file (in the order given), copying one
// tensor at a time to the host. With `produce`, the bytes written for tensor i are those of
// produce(i), made just before they are written (it must have tensors[i]'s dtype and shape): a
// derived tensor (a merged weight) exists one at a time too.
inline absl::Status WriteTensors(const std::string& path, const NamedTensors& tensors,
                                 const std::map<std::string, std::string>& metadata, ProgressMeter* progress,
                                 const std::function<torch::Tensor(size_t)>& produce = {}) {
  std::vector<TensorToWrite> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    auto d = SafetensorsDType(t.scalar_type());
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("\"", name, "\": ", d.status().message()));
    out.push_back({name, *d, t.sizes().vec(), nullptr});
  }
  torch::Tensor host;  // the tensor being written
  return WriteSafetensors(path, out, metadata, progress, [&](size_t i) -> absl::StatusOr<const void*> {
    torch::Tensor t = produce ? produce(i) : tensors[i].second;
    if (t.scalar_type() != tensors[i].second.scalar_type() || t.sizes() != tensors[i].second.sizes()) {
      return absl::InternalError(absl::StrCat("\"", tensors[i].first, "\": the tensor to write changed dtype or shape"));
    }
    host = t.detach().to(torch::kCPU).contiguous();
    return host.data_ptr();
  });
}

inline std::string ShapeString(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace ftd::engine
