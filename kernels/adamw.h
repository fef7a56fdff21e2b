// AdamW as one multi-tensor step (torch.optim.AdamW semantics, decoupled weight decay), and a
// multi-tensor sum of squares for the global gradient norm. Contract, precision and launch layout are at
// the top of kernels/adamw.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

namespace ftd::kernels {

struct AdamWTensor {
  void* param;       // [numel] param dtype (updated in place)
  float* master;     // [numel] fp32 master weights, or nullptr; when set the update runs on master
                     // and param = round(master) afterwards
  const void* grad;  // [numel] grad dtype
  void* exp_avg;     // [numel] moment dtype (updated in place)
  void* exp_avg_sq;  // [numel] moment dtype
  int64_t numel;
  float weight_decay;  // per tensor (0 for norm weights)
};

struct AdamWParams {
  float lr, beta1, beta2, eps;
  DType param_dtype, grad_dtype, moment_dtype;  // moments are bf16 or fp32 (bf16 saves 4 B/param)
};

// One AdamW update of every tensor, per element in fp32:
//   g = grad * grad_scale; w = w * (1 - lr * wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//   w -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
// (w is master when set, else param). tensors: HOST array of num_tensors descriptors (read during the
// call only). step: device fp32 scalar, the 1-based count of this update. grad_scale: device fp32 scalar
// or nullptr (1). found_inf: device fp32 scalar or nullptr; when non-zero (or NaN) nothing is written.
// Buffers of one tensor must not overlap each other or another tensor's; any alignment works (16-byte
// aligned tensors take the vector path). No allocation, no host synchronisation; a handful of launches
// (one per 320 tensors). Returns cudaErrorInvalidValue for num_tensors < 0, numel < 0, or a null pointer
// (step; param, grad, exp_avg, exp_avg_sq of a tensor with numel > 0).
cudaError_t AdamWStep(const AdamWTensor* tensors, int num_tensors, const AdamWParams& p, const float* step,
                      const float* grad_scale, const float* found_inf, cudaStream_t stream);

// Bytes of workspace MultiTensorSumSquares needs for these tensor sizes (4 bytes per 65536 elements of
// each tensor, rounded up per tensor); 0 when there are no elements.
size_t MultiTensorSumSquaresWorkspaceBytes(const int64_t* numels, int num_tensors);

// out[0] (=) = sum over all tensors and elements of grad^2, as fp32 (per-block partial sums in fp32,
// then summed in float64 in a fixed order: deterministic). grads: HOST array of device pointers,
// numels: HOST array. workspace: at least MultiTensorSumSquaresWorkspaceBytes(numels, num_tensors)
// bytes (ws_bytes), 4-byte aligned, contents ignored. The global norm is sqrt(out[0]).
cudaError_t MultiTensorSumSquares(const void* const* grads, const int64_t* numels, int num_tensors, DType grad_dtype,
                                  float* out, void* workspace, size_t ws_bytes, cudaStream_t stream);

}  // namespace ftd::kernels
