#include "kernels/cross_entropy_ref.h"

#include <cmath>
#include <limits>

namespace ftd::kernels::ref {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

void CrossEntropyForward(std::span<const double> logits, int64_t ld, std::span<const int64_t> labels,
                         std::span<double> loss, std::span<double> lse, int64_t rows, int64_t vocab,
                         int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = logits.data() + r * ld;
    // One pass: m is the largest logit so far, s = sum of exp(x_j - m) over the logits so far.
    double m = -std::numeric_limits<double>::infinity();
    double s = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      if (x[j] == -std::numeric_limits<double>::infinity()) continue;  // contributes exp(-inf) = 0
      if (x[j] > m) {
        s = s * std::exp(m - x[j]) + 1;  // rescale the old sum to the new max; the new term is exp(0)
        m = x[j];
      } else {
        s += std::exp(x[j] - m);  // NaN falls here and propagates
      }
    }
    lse[r] = m + std::log(s);
    const int64_t y = labels[r];
    if (y == ignore_index) {
      loss[r] = 0;
    } else if (y < 0 || y >= vocab) {
      loss[r] = kNaN;
    } else {
      loss[r] = lse[r] - x[y];
    }
  }
}

void CrossEntropyBackward(std::span<const double> logits, int64_t ld, std::span<const int64_t> labels,
                          std::span<const double> lse, std::span<const double> grad_loss, int64_t grad_stride,
                          std::span<double> dlogits, int64_t ld_out, int64_t rows, int64_t vocab,
                          int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = logits.data() + r * ld;
    double* d = dlogits.data() + r * ld_out;
    const int64_t y = labels[r];
    const double g = grad_loss.empty() ? 1.0 : grad_loss[r * grad_stride];
    for (int64_t j = 0; j < vocab; ++j) {
      if (y == ignore_index) {
        d[j] = 0;
      } else if (y < 0 || y >= vocab) {
        d[j] = kNaN;
      } else {
        d[j] = g * (std::exp(x[j] - lse[r]) - (j == y ? 1.0 : 0.0));
      }
    }
  }
}

}  // namespace ftd::kernels::ref
