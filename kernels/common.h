// Shared, torch-free vocabulary of the kernel families: the element types a launcher accepts and
// the error type every launcher returns. Host code only; device helpers are in common.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ftd::kernels {

// Storage type of a tensor argument. Arithmetic is always fp32 inside the kernels.
enum class DType { kF32, kBF16 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) { return t == DType::kF32 ? "fp32" : "bf16"; }

// a / b rounded up, for a >= 0 and b > 0.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace ftd::kernels
