// Fused RMSNorm (LLaMA): y = w * x / sqrt(mean(x^2) + eps), statistics in fp32. Contract, precision
// and the tail/alignment rules are at the top of kernels/rmsnorm.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common.h"
#include "kernels/launch_plan.h"

namespace ftd::kernels {

// How RMSNorm launches on one device for rows of n elements of `dtype`: which path applies to aligned
// pointers, the block shapes, the rings' stages, the blocks resident at once. Made once by PlanRmsNorm
// (occupancy queries, which also set the kernels' shared-memory attributes on the device) and valid for
// any number of rows and any pointers on that device, from any thread. The caller keeps it (the worker's
// adapter caches one per device, dtype and n). The fields are the launchers' business.
struct RmsNormPlan {
  int device = -1;  // CUDA ordinal; -1: not planned
  DType dtype = DType::kF32;
  int64_t n = 0;
  bool pdl = false;  // kernels launched as programmatic dependent launches (sm_90+)
  // Pipelined path (kernels/rmsnorm.cu), taken with 16-byte aligned pointers where fwd/bwd.ok.
  int fwd_threads = 0, bwd_threads = 0, bwd_chunks = 0;
  RingPlan fwd, bwd;
  // Looped backward: blocks resident at once, 16-byte vector kernel (n % V == 0) and scalar kernel.
  int64_t looped_bwd_resident_vec = 1, looped_bwd_resident_scalar = 1;
};

// Plans RMSNorm over rows of n elements (1 <= n < 2^31) on `device`, which must be the current device.
cudaError_t PlanRmsNorm(const DeviceProps& device, DType dtype, int64_t n, RmsNormPlan* plan);

// x: [rows, plan.n] row-major, w: [plan.n], y: [rows, plan.n] (=), all of plan.dtype; rstd: [rows] fp32 (=),
// 1/sqrt(mean(x^2) + eps), saved for the backward. y may alias x (in place). The current device must be
// plan.device. Requires rows >= 0 and non-null pointers (rows == 0 does nothing).
cudaError_t RmsNormForward(const RmsNormPlan& plan, const void* x, const void* w, void* y, float* rstd, int64_t rows,
                           float eps, cudaStream_t stream);

// Bytes of device workspace RmsNormBackward needs (fp32 per-block partial sums of dw), 4-byte aligned.
size_t RmsNormBackwardWorkspaceBytes(int64_t rows, int64_t n);

// dy, x, dx: [rows, n]; w: [n]; dw: [n]; all of plan.dtype, n = plan.n. rstd: [rows] fp32 from RmsNormForward.
// dx (=) = rstd * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * rstd;
// dw (=) = sum over rows of dy * xhat, accumulated in fp32 in a fixed order (deterministic).
// workspace: RmsNormBackwardWorkspaceBytes(rows, n) bytes, 4-byte aligned, contents ignored.
// dx may alias dy (in place); dw must not overlap anything. The current device must be plan.device.
// Requires rows >= 0, non-null pointers (workspace may be null only when rows == 0; then dw = 0).
cudaError_t RmsNormBackward(const RmsNormPlan& plan, const void* dy, const void* x, const void* w, const float* rstd,
                            void* dx, void* dw, void* workspace, int64_t rows, cudaStream_t stream);

}  // namespace ftd::kernels
