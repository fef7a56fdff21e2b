// Fused linear cross-entropy: lm_head (x W^T) and the cross-entropy loss, forward and backward in one
// call, chunk by chunk over the rows, so the [rows, vocab] logits are never materialised. The
// gradients are computed during this call (Liger-style): the caller's backward only scales them.
// Contract, precision and layout rules are at the top of kernels/fused_linear_ce.cu.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common.h"

namespace ftd::kernels {

// Default rows per chunk for LLaMA-3.1-8B (hidden 4096, vocab 128256): 2048 rows of bf16 logits are
// 501 MiB of workspace, 1/8 of the logits materialised at 16384 rows, and keep the three GEMMs large
// enough (M, N, K >= 2048) to run near the tensor-core rate.
inline constexpr int64_t kFusedLinearCeDefaultChunkRows = 2048;

// Bytes of device workspace FusedLinearCrossEntropy needs for these sizes: one chunk of logits,
// min(chunk_rows, rows) x round_up(vocab, 16 bytes / element size) elements of `dtype`.
// 0 for rows == 0 or invalid sizes (rows < 0, hidden < 1, vocab < 1, chunk_rows < 1).
size_t FusedLinearCrossEntropyWorkspaceBytes(DType dtype, int64_t rows, int64_t hidden, int64_t vocab,
                                             int64_t chunk_rows);

// x: [rows, hidden], weight: [vocab, hidden] (HF's lm_head.weight), both row-major in `dtype`;
// labels: [rows] int64. Writes (=) loss[rows] and lse[rows] (fp32, as CrossEntropyForward: 0 loss for
// ignore_index, NaN for a label outside [0, vocab)), dx [rows, hidden] (=) and dweight [vocab, hidden]
// (= unless accumulate_dweight, then +=), the gradients of sum_r s * loss[r] with s = *grad_scale
// (device fp32 scalar) or 1 when grad_scale is nullptr. dweight nullptr: no weight gradient is
// computed (a frozen lm_head, as in LoRA), accumulate_dweight is ignored. dx may alias x (in place); no other overlap.
// workspace: device memory of at least FusedLinearCrossEntropyWorkspaceBytes(...) bytes, 16-byte
// aligned. Sets the handle's stream to `stream` (only when it differs: cublasSetStream also resets
// the handle's workspace); the handle's pointer mode is restored on return, its math mode applies.
// rows == 0 only zeroes dweight (unless accumulate_dweight or dweight is nullptr).
// cudaErrorInvalidValue: null handle or pointer, sizes < 1 (rows < 0), hidden/vocab/chunk_rows beyond
// INT_MAX, a pointer misaligned for its element size, a workspace too small or not 16-byte aligned.
// cuBLAS failures map to the closest cudaError_t (cudaErrorNotSupported, cudaErrorMemoryAllocation,
// cudaErrorLaunchFailure, otherwise cudaErrorUnknown).
cudaError_t FusedLinearCrossEntropy(cublasHandle_t handle, DType dtype, const void* x, const void* weight,
                                    const int64_t* labels, float* loss, float* lse, void* dx, void* dweight,
                                    bool accumulate_dweight, const float* grad_scale, void* workspace,
                                    size_t workspace_bytes, int64_t rows, int64_t hidden, int64_t vocab,
                                    int64_t chunk_rows, int64_t ignore_index, cudaStream_t stream);

}  // namespace ftd::kernels
