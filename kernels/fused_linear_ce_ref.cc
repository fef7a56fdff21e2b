#include "kernels/fused_linear_ce_ref.h"

#include <algorithm>
#include <vector>

#include "kernels/cross_entropy_ref.h"

namespace ftd::kernels::ref {

void FusedLinearCrossEntropy(std::span<const double> x, std::span<const double> weight,
                             std::span<const int64_t> labels, std::span<double> loss, std::span<double> lse,
                             std::span<double> dx, std::span<double> dweight, bool accumulate_dweight,
                             double grad_scale, int64_t rows, int64_t hidden, int64_t vocab, int64_t chunk_rows,
                             int64_t ignore_index, const std::function<double(double)>& store) {
  if (!accumulate_dweight) std::fill(dweight.begin(), dweight.end(), 0.0);
  const std::vector<double> scale = {grad_scale};
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    const auto xc = x.subspan(static_cast<size_t>(r0 * hidden), static_cast<size_t>(n * hidden));
    const auto lc = labels.subspan(static_cast<size_t>(r0), static_cast<size_t>(n));
    const auto loss_c = loss.subspan(static_cast<size_t>(r0), static_cast<size_t>(n));
    const auto lse_c = lse.subspan(static_cast<size_t>(r0), static_cast<size_t>(n));

    // logits_c = x_c W^T, stored.
    std::vector<double> logits(static_cast<size_t>(n * vocab));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < vocab; ++j) {
        double z = 0;
        for (int64_t k = 0; k < hidden; ++k) z += xc[i * hidden + k] * weight[j * hidden + k];
        logits[i * vocab + j] = store(z);
      }
    }

    // Cross-entropy forward and backward of the chunk; dlogits stored.
    CrossEntropyForward(logits, vocab, lc, loss_c, lse_c, n, vocab, ignore_index);
    std::vector<double> dlogits(static_cast<size_t>(n * vocab));
    CrossEntropyBackward(logits, vocab, lc, lse_c, scale, 0, dlogits, vocab, n, vocab, ignore_index);
    for (auto& d : dlogits) d = store(d);

    // dweight += dlogits_c^T x_c;  dx_c = dlogits_c W.
    for (int64_t j = 0; j < vocab; ++j) {
      for (int64_t k = 0; k < hidden; ++k) {
        double acc = 0;
        for (int64_t i = 0; i < n; ++i) acc += dlogits[i * vocab + j] * xc[i * hidden + k];
        dweight[j * hidden + k] += acc;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < hidden; ++k) {
        double acc = 0;
        for (int64_t j = 0; j < vocab; ++j) acc += dlogits[i * vocab + j] * weight[j * hidden + k];
        dx[(r0 + i) * hidden + k] = acc;
      }
    }
  }
}

}  // namespace ftd::kernels::ref
