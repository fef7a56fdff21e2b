// Plain C++ float64 reference of kernels/fused_linear_ce.cu: the same chunked algorithm written for
// clarity (logits of a chunk of rows, cross-entropy forward and backward through the cross-entropy
// reference, then dweight (+)= dlogits^T x_c and dx_c = dlogits W). Used by the GPU test as its
// float64 truth.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

namespace ftd::kernels::ref {

// x: (rows, hidden), weight: (vocab, hidden), row-major; labels: (rows).
// Writes loss, lse (rows), dx (rows, hidden); dweight (vocab, hidden) is written, or added to when
// accumulate_dweight. Gradients are those of sum_r grad_scale * loss[r].
// `store` models the workspace's storage type: it is applied to each chunk's logits before the
// softmax and to dlogits before the two gradient products (identity for exact float64; rounding to
// bf16 to mimic a bf16 workspace). dx and dweight themselves are kept in float64.
void FusedLinearCrossEntropy(std::span<const double> x, std::span<const double> weight,
                             std::span<const int64_t> labels, std::span<double> loss, std::span<double> lse,
                             std::span<double> dx, std::span<double> dweight, bool accumulate_dweight,
                             double grad_scale, int64_t rows, int64_t hidden, int64_t vocab, int64_t chunk_rows,
                             int64_t ignore_index, const std::function<double(double)>& store);

}  // namespace ftd::kernels::ref
