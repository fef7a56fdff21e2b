// Small LibTorch helpers shared by the engine's translation units.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/fs_util.h"
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

inline std::string ShapeString(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace ftd::engine
