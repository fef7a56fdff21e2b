// Cross-entropy over a [rows, vocab] logits matrix with an online softmax: the forward pass reads
// each row once for the log-sum-exp (running max and rescaled sum), the backward pass recomputes the
// softmax from the saved lse and writes the gradient, so no softmax tensor is ever materialised.
// Contract, precision and layout rules are at the top of kernels/cross_entropy.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common.h"

namespace ftd::kernels {

// lse[r]  (=) log(sum_j exp(logits[r, j]))                       for every row
// loss[r] (=) lse[r] - logits[r, labels[r]]                      (0 where labels[r] == ignore_index)
// logits: [rows, vocab] in `dtype`, row stride ld >= vocab elements, pointer aligned to its element
// size; labels: [rows] int64; loss, lse: [rows] fp32. All device pointers.
// A label outside [0, vocab) that is not ignore_index makes that row's loss NaN (the trainer's finite
// check then stops the run with a non-finite loss).
// cudaErrorInvalidValue: rows < 0, vocab < 1, ld < vocab, a null pointer, a misaligned logits pointer.
// rows == 0 launches nothing.
cudaError_t CrossEntropyForward(DType dtype, const void* logits, int64_t ld, const int64_t* labels, float* loss,
                                float* lse, int64_t rows, int64_t vocab, int64_t ignore_index,
                                cudaStream_t stream);

// dlogits[r, j] (=) g_r * (exp(logits[r, j] - lse[r]) - (j == labels[r])),  g_r = grad_loss[r * grad_stride]
// Rows with labels[r] == ignore_index get 0 (their logits are not read); rows with a label outside
// [0, vocab) that is not ignore_index get NaN. grad_loss is a DEVICE pointer: grad_stride 0 gives one
// scalar for every row (e.g. 1/count for a mean), 1 one value per row; nullptr means g_r = 1.
// dlogits: [rows, vocab] in `dtype`, row stride ld_out >= vocab; only columns [0, vocab) are written.
// dlogits may alias logits exactly (in place: dlogits == logits and ld_out == ld); any other overlap
// is cudaErrorInvalidValue. lse: [rows] fp32, CrossEntropyForward's output for the same logits; lse
// and grad_loss are read for every row, ignored ones included.
// cudaErrorInvalidValue also for: rows < 0, vocab < 1, ld or ld_out < vocab, grad_stride < 0, a null
// logits/labels/lse/dlogits pointer, a logits/dlogits pointer misaligned for its element size.
cudaError_t CrossEntropyBackward(DType dtype, const void* logits, int64_t ld, const int64_t* labels,
                                 const float* lse, const float* grad_loss, int64_t grad_stride, void* dlogits,
                                 int64_t ld_out, int64_t rows, int64_t vocab, int64_t ignore_index,
                                 cudaStream_t stream);

}  // namespace ftd::kernels
