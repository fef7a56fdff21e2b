// Plain C++ float64 reference of kernels/cross_entropy.cu, the same algorithm written for clarity:
// an online (one-pass, running max and rescaled sum) log-sum-exp per row, and the backward
// g * (softmax - onehot) recomputed from the saved lse. Used by the GPU test as its float64 truth.
#pragma once

#include <cstdint>
#include <span>

namespace ftd::kernels::ref {

// logits: (rows, vocab) with row stride ld; labels: (rows); loss, lse: (rows), written.
// loss is 0 for ignore_index rows and NaN for labels outside [0, vocab).
void CrossEntropyForward(std::span<const double> logits, int64_t ld, std::span<const int64_t> labels,
                         std::span<double> loss, std::span<double> lse, int64_t rows, int64_t vocab,
                         int64_t ignore_index);

// dlogits: (rows, vocab) with row stride ld_out; only columns [0, vocab) are written.
// g_r = grad_loss[r * grad_stride], or 1 when grad_loss is empty. Ignored rows get 0, rows with an
// out-of-range label NaN.
void CrossEntropyBackward(std::span<const double> logits, int64_t ld, std::span<const int64_t> labels,
                          std::span<const double> lse, std::span<const double> grad_loss, int64_t grad_stride,
                          std::span<double> dlogits, int64_t ld_out, int64_t rows, int64_t vocab,
                          int64_t ignore_index);

}  // namespace ftd::kernels::ref
