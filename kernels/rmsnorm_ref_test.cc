// The RMSNorm reference against independent float64 formulas: the forward against the textbook
// w * x / sqrt(mean(x^2) + eps) written another way, the backward against central finite differences
// of the forward (L = sum(dy * y), so dL/dx and dL/dw are exactly what dx and dw must be).
#include "kernels/rmsnorm_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

double Loss(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& dy, int64_t rows,
            int64_t n, double eps) {
  std::vector<double> y, rstd;
  ref::RmsNormForward(x, w, rows, n, eps, &y, &rstd);
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
  return l;
}

// eps 1e-5 (LLaMA-3), 1e-6 and an odd value; rows whose root-mean-square is 1.5, sqrt(eps), 0.3 sqrt(eps)
// and 3 sqrt(eps), so that in three rows of four eps moves rstd by 5% to 75%: far beyond the tolerances
// below, so a reference that ignores eps or uses another value fails.
constexpr double kEps[] = {1e-5, 1e-6, 3.1e-4};

// Row r of x drawn at the r % 4-th scale above.
std::vector<double> EpsSensitiveX(int64_t rows, int64_t n, double eps, std::mt19937_64& rng) {
  const double scale[4] = {1.5, std::sqrt(eps), 0.3 * std::sqrt(eps), 3 * std::sqrt(eps)};
  std::vector<double> x = RandomNormal(static_cast<size_t>(rows * n), 0, 1, rng);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(r * n + i)] *= scale[r % 4];
  }
  return x;
}

std::string Where(int64_t n, double eps) { return "n " + std::to_string(n) + " eps " + std::to_string(eps) + SeedNote(); }

TEST(RmsNormRef, ForwardMatchesDirectFormula) {
  std::mt19937_64 rng(TestSeed());
  for (double eps : kEps) {
    for (int64_t n : {1, 7, 64, 4097}) {
      const int64_t rows = 5;
      auto x = EpsSensitiveX(rows, n, eps, rng), w = RandomNormal(n, 1, 0.2, rng);
      std::vector<double> y, rstd;
      ref::RmsNormForward(x, w, rows, n, eps, &y, &rstd);
      for (int64_t r = 0; r < rows; ++r) {
        // rstd written as sqrt(n) / sqrt(sum(x^2) + n * eps), the squares summed in the reverse order.
        double ss = 0;
        for (int64_t i = n - 1; i >= 0; --i) ss += std::pow(x[r * n + i], 2);
        const double scale = std::sqrt(static_cast<double>(n)) / std::sqrt(ss + n * eps);
        EXPECT_NEAR(rstd[r], scale, 1e-12 * scale) << "row " << r << " " << Where(n, eps);
        for (int64_t i = 0; i < n; ++i) {
          const double want = w[i] * x[r * n + i] * scale;
          ASSERT_NEAR(y[r * n + i], want, 1e-12 * (1 + std::fabs(want))) << "row " << r << " " << Where(n, eps);
        }
      }
    }
  }
}

// Finite-difference steps are a small fraction of each row's scale (rows differ in scale by 10^4).
TEST(RmsNormRef, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(TestSeed());
  for (double eps : kEps) {
    for (int64_t n : {1, 2, 5, 9}) {
      const int64_t rows = 4;
      auto x = EpsSensitiveX(rows, n, eps, rng), w = RandomNormal(n, 1, 0.3, rng),
           dy = RandomNormal(rows * n, 0, 1, rng);
      std::vector<double> y, rstd, dx, dw;
      ref::RmsNormForward(x, w, rows, n, eps, &y, &rstd);
      ref::RmsNormBackward(dy, x, w, rstd, rows, n, &dx, &dw);
      for (int64_t i = 0; i < rows * n; ++i) {
        const double h = 1e-5 / rstd[i / n];  // 1e-5 of the row's root-mean-square (with eps)
        auto xp = x, xm = x;
        xp[i] += h;
        xm[i] -= h;
        const double fd = (Loss(xp, w, dy, rows, n, eps) - Loss(xm, w, dy, rows, n, eps)) / (2 * h);
        EXPECT_NEAR(dx[i], fd, 1e-6 * (1 + std::fabs(fd))) << "dx[" << i << "] " << Where(n, eps);
      }
      for (int64_t i = 0; i < n; ++i) {
        const double h = 1e-5;
        auto wp = w, wm = w;
        wp[i] += h;
        wm[i] -= h;
        const double fd = (Loss(x, wp, dy, rows, n, eps) - Loss(x, wm, dy, rows, n, eps)) / (2 * h);
        EXPECT_NEAR(dw[i], fd, 1e-7 * (1 + std::fabs(fd))) << "dw[" << i << "] " << Where(n, eps);
      }
    }
  }
}

}  // namespace
}  // namespace ftd::kernels
