#include "kernels/rmsnorm_ref.h"

#include <cmath>

namespace ftd::kernels::ref {

void RmsNormForward(const std::vector<double>& x, const std::vector<double>& w, int64_t rows, int64_t n, double eps,
                    std::vector<double>* y, std::vector<double>* rstd) {
  y->assign(static_cast<size_t>(rows * n), 0.0);
  rstd->assign(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    (*rstd)[r] = s;
    for (int64_t i = 0; i < n; ++i) (*y)[r * n + i] = w[i] * xr[i] * s;
  }
}

void RmsNormBackward(const std::vector<double>& dy, const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>& rstd, int64_t rows, int64_t n, std::vector<double>* dx,
                     std::vector<double>* dw) {
  dx->assign(static_cast<size_t>(rows * n), 0.0);
  dw->assign(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double s = rstd[r];
    double mean_gxhat = 0;
    for (int64_t i = 0; i < n; ++i) mean_gxhat += dy[r * n + i] * w[i] * x[r * n + i] * s;
    mean_gxhat /= static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = dy[r * n + i] * w[i];
      const double xhat = x[r * n + i] * s;
      (*dx)[r * n + i] = s * (g - xhat * mean_gxhat);
      (*dw)[i] += dy[r * n + i] * xhat;
    }
  }
}

}  // namespace ftd::kernels::ref
