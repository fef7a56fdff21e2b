// The RMSNorm reference against independent float64 formulas: the forward against the textbook
// w * x / sqrt(mean(x^2) + eps) written another way, the backward against central finite differences
// of the forward (L = sum(dy * y), so dL/dx and dL/dw are exactly what dx and dw must be).
#include "kernels/rmsnorm_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using testing::RandomNormal;
using testing::SeedNote;
using testing::TestSeed;

double Loss(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& dy, int64_t rows,
            int64_t n, double eps) {
  std::vector<double> y, rstd;
  ref::RmsNormForward(x, w, rows, n, eps, &y, &rstd);
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
  return l;
}

TEST(RmsNormRef, ForwardMatchesDirectFormula) {
  std::mt19937_64 rng(TestSeed());
  for (int64_t n : {1, 7, 64, 4097}) {
    const int64_t rows = 5;
    const double eps = 1e-5;
    auto x = RandomNormal(rows * n, 0, 1.5, rng), w = RandomNormal(n, 1, 0.2, rng);
    std::vector<double> y, rstd;
    ref::RmsNormForward(x, w, rows, n, eps, &y, &rstd);
    for (int64_t r = 0; r < rows; ++r) {
      // rstd written as sqrt(n) / sqrt(sum(x^2) + n * eps), the squares summed in the reverse order.
      double ss = 0;
      for (int64_t i = n - 1; i >= 0; --i) ss += std::pow(x[r * n + i], 2);
      const double scale = std::sqrt(static_cast<double>(n)) / std::sqrt(ss + n * eps);
      EXPECT_NEAR(rstd[r], scale, 1e-12 * scale) << "n " << n << SeedNote();
      for (int64_t i = 0; i < n; ++i) {
        const double want = w[i] * x[r * n + i] * scale;
        ASSERT_NEAR(y[r * n + i], want, 1e-12 * (1 + std::fabs(want))) << "n " << n << " row " << r << SeedNote();
      }
    }
  }
}

TEST(RmsNormRef, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(TestSeed());
  for (int64_t n : {1, 2, 5, 9}) {
    const int64_t rows = 3;
    const double eps = 1e-3, h = 1e-5;
    auto x = RandomNormal(rows * n, 0, 1, rng), w = RandomNormal(n, 1, 0.3, rng),
         dy = RandomNormal(rows * n, 0, 1, rng);
    std::vector<double> y, rstd, dx, dw;
    ref::RmsNormForward(x, w, rows, n, eps, &y, &rstd);
    ref::RmsNormBackward(dy, x, w, rstd, rows, n, &dx, &dw);
    for (int64_t i = 0; i < rows * n; ++i) {
      auto xp = x, xm = x;
      xp[i] += h;
      xm[i] -= h;
      const double fd = (Loss(xp, w, dy, rows, n, eps) - Loss(xm, w, dy, rows, n, eps)) / (2 * h);
      EXPECT_NEAR(dx[i], fd, 1e-7 * (1 + std::fabs(fd))) << "dx[" << i << "] n " << n << SeedNote();
    }
    for (int64_t i = 0; i < n; ++i) {
      auto wp = w, wm = w;
      wp[i] += h;
      wm[i] -= h;
      const double fd = (Loss(x, wp, dy, rows, n, eps) - Loss(x, wm, dy, rows, n, eps)) / (2 * h);
      EXPECT_NEAR(dw[i], fd, 1e-7 * (1 + std::fabs(fd))) << "dw[" << i << "] n " << n << SeedNote();
    }
  }
}

}  // namespace
}  // namespace ftd::kernels
