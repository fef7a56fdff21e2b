// Proves the float64 cross-entropy reference against independent formulas: the one-pass online
// log-sum-exp against the two-pass (max first, then sum) formula, and the analytic backward against
// central finite differences of the forward loss.
#include "kernels/cross_entropy_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace ftd::kernels::ref {
namespace {

constexpr int64_t kIgnore = -100;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Two-pass log-sum-exp over one row, written independently of the reference.
double TwoPassLse(const double* x, int64_t n) {
  double m = -kInf;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  if (m == -kInf) return -kInf;
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - m);
  return m + std::log(s);
}

// Rows that stress the online update: random, ascending (a new max at every element), descending,
// a large offset (exp would overflow without the max shift), and rows holding -inf entries.
std::vector<double> StressLogits(int64_t rows, int64_t vocab, int64_t ld, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0, 3);
  std::vector<double> x(static_cast<size_t>(rows * ld), 12345.0);  // padding sentinel
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < vocab; ++j) {
      double v = normal(rng);
      switch (r % 5) {
        case 1: v = 0.25 * static_cast<double>(j) + 0.01 * v; break;
        case 2: v = -0.25 * static_cast<double>(j) + 0.01 * v; break;
        case 3: v += 1000; break;
        case 4: v = (j % 3 == 1) ? -kInf : v; break;
        default: break;
      }
      x[static_cast<size_t>(r * ld + j)] = v;
    }
  }
  // The -inf pattern (j % 3 == 1) keeps j = 0 finite, so every row has a finite lse.
  return x;
}

TEST(CrossEntropyRef, OnlineLseMatchesTwoPass) {
  std::mt19937_64 rng(1);
  for (int64_t vocab : {1, 2, 7, 1000, 4097}) {
    const int64_t rows = 10, ld = vocab + 3;
    const auto x = StressLogits(rows, vocab, ld, rng);
    std::vector<int64_t> labels(rows);
    for (int64_t r = 0; r < rows; ++r) labels[r] = (r * 7) % vocab;
    std::vector<double> loss(rows), lse(rows);
    CrossEntropyForward(x, ld, labels, loss, lse, rows, vocab, kIgnore);
    for (int64_t r = 0; r < rows; ++r) {
      const double want = TwoPassLse(x.data() + r * ld, vocab);
      ASSERT_TRUE(std::isfinite(want)) << "vocab " << vocab << " row " << r;
      EXPECT_NEAR(lse[r], want, 1e-12 * std::max(1.0, std::fabs(want))) << "vocab " << vocab << " row " << r;
      const double x_label = x[static_cast<size_t>(r * ld + labels[r])];
      if (std::isfinite(x_label)) {
        EXPECT_NEAR(loss[r], want - x_label, 1e-12 * std::max(1.0, std::fabs(want))) << "row " << r;
      } else {
        EXPECT_EQ(loss[r], kInf) << "a -inf label logit has infinite loss, row " << r;
      }
    }
  }
}

TEST(CrossEntropyRef, IgnoredAndInvalidLabels) {
  const int64_t rows = 4, vocab = 5;
  const std::vector<double> x = {0.1, 0.2, 0.3, 0.4, 0.5, 1, 2, 3, 4, 5, -1, 0, 1, 0, -1, 3, 3, 3, 3, 3};
  const std::vector<int64_t> labels = {kIgnore, 5, -1, 2};
  std::vector<double> loss(rows), lse(rows);
  CrossEntropyForward(x, vocab, labels, loss, lse, rows, vocab, kIgnore);
  EXPECT_EQ(loss[0], 0.0);
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_TRUE(std::isnan(loss[2]));
  EXPECT_NEAR(loss[3], std::log(5.0), 1e-15);  // uniform row: loss = log(vocab)
  EXPECT_NEAR(lse[0], TwoPassLse(x.data(), vocab), 1e-15) << "lse is written for ignored rows too";

  std::vector<double> d(rows * vocab, 7.0);
  const std::vector<double> g = {2.0};
  CrossEntropyBackward(x, vocab, labels, lse, g, 0, d, vocab, rows, vocab, kIgnore);
  for (int64_t j = 0; j < vocab; ++j) {
    EXPECT_EQ(d[j], 0.0);
    EXPECT_TRUE(std::isnan(d[vocab + j]));
    EXPECT_TRUE(std::isnan(d[2 * vocab + j]));
    EXPECT_NEAR(d[3 * vocab + j], 2.0 * (0.2 - (j == 2 ? 1.0 : 0.0)), 1e-15);
  }
}

// f(x) = sum_r g_r * loss_r(x); the reference backward must be its gradient.
TEST(CrossEntropyRef, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(2);
  std::normal_distribution<double> normal(0, 2);
  const int64_t rows = 4, vocab = 6, ld = 8, ld_out = 9;
  std::vector<double> x(rows * ld, 0.0);
  for (auto& v : x) v = normal(rng);
  const std::vector<int64_t> labels = {3, kIgnore, 0, 5};
  for (int64_t grad_stride : {0, 1}) {
    const std::vector<double> g = grad_stride == 0 ? std::vector<double>{0.37} : std::vector<double>{0.5, -1.5, 2.0, 0.25};
    auto objective = [&](const std::vector<double>& xs) {
      std::vector<double> loss(rows), lse(rows);
      CrossEntropyForward(xs, ld, labels, loss, lse, rows, vocab, kIgnore);
      double f = 0;
      for (int64_t r = 0; r < rows; ++r) f += g[r * grad_stride] * loss[r];
      return f;
    };
    std::vector<double> loss(rows), lse(rows);
    CrossEntropyForward(x, ld, labels, loss, lse, rows, vocab, kIgnore);
    std::vector<double> d(rows * ld_out, 99.0);
    CrossEntropyBackward(x, ld, labels, lse, g, grad_stride, d, ld_out, rows, vocab, kIgnore);
    const double h = 1e-5;
    for (int64_t r = 0; r < rows; ++r) {
      double row_sum = 0;
      for (int64_t j = 0; j < vocab; ++j) {
        auto xp = x, xm = x;
        xp[r * ld + j] += h;
        xm[r * ld + j] -= h;
        const double fd = (objective(xp) - objective(xm)) / (2 * h);
        EXPECT_NEAR(d[r * ld_out + j], fd, 1e-8) << "stride " << grad_stride << " r " << r << " j " << j;
        row_sum += d[r * ld_out + j];
      }
      EXPECT_NEAR(row_sum, 0.0, 1e-14) << "softmax minus one-hot sums to zero";
      for (int64_t j = vocab; j < ld_out; ++j) EXPECT_EQ(d[r * ld_out + j], 99.0) << "padding untouched";
    }
  }
}

}  // namespace
}  // namespace ftd::kernels::ref
