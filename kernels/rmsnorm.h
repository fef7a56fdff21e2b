// Fused RMSNorm (LLaMA): y = w * x / sqrt(mean(x^2) + eps), statistics in fp32. Contract, precision
// and the tail/alignment rules are at the top of kernels/rmsnorm.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

namespace ftd::kernels {

// x: [rows, n] row-major, w: [n], y: [rows, n] (=), all of `dtype`; rstd: [rows] fp32 (=),
// 1/sqrt(mean(x^2) + eps), saved for the backward. y may alias x (in place).
// Requires rows >= 0, 1 <= n < 2^31, non-null pointers (rows == 0 does nothing).
cudaError_t RmsNormForward(DType dtype, const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n,
                           float eps, cudaStream_t stream);

// Bytes of device workspace RmsNormBackward needs (fp32 per-block partial sums of dw), 4-byte aligned.
size_t RmsNormBackwardWorkspaceBytes(int64_t rows, int64_t n);

// dy, x, dx: [rows, n]; w: [n]; dw: [n]; all of `dtype`. rstd: [rows] fp32 from RmsNormForward.
// dx (=) = rstd * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * rstd;
// dw (=) = sum over rows of dy * xhat, accumulated in fp32 in a fixed order (deterministic).
// workspace: RmsNormBackwardWorkspaceBytes(rows, n) bytes, 4-byte aligned, contents ignored.
// dx may alias dy (in place); dw must not overlap anything. Requires rows >= 0, 1 <= n < 2^31, non-null
// pointers (workspace may be null only when rows == 0; then dw = 0).
cudaError_t RmsNormBackward(DType dtype, const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                            void* dw, void* workspace, int64_t rows, int64_t n, cudaStream_t stream);

}  // namespace ftd::kernels
