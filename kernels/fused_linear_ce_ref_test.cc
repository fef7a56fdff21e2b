// Proves the float64 fused linear cross-entropy reference: its chunked algorithm against a direct,
// unchunked formula (full logits matrix, two-pass softmax, whole-matrix gradient products), with
// and without a storage rounding, and its gradients against central finite differences of its loss.
#include "kernels/fused_linear_ce_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace ftd::kernels::ref {
namespace {

constexpr int64_t kIgnore = -100;

double Identity(double v) { return v; }
double Eighths(double v) { return std::round(v * 8) / 8; }  // a coarse, visible storage rounding

struct Result {
  std::vector<double> loss, lse, dx, dw;
};

// Unchunked: Z = store(X W^T); loss = lse - Z[y]; G = store(s (softmax(Z) - onehot)), 0 on ignored
// rows; dx = G W; dw = dw0 + G^T X.
Result Direct(const std::vector<double>& x, const std::vector<double>& w, const std::vector<int64_t>& y,
              int64_t rows, int64_t hidden, int64_t vocab, double s, double (*store)(double),
              const std::vector<double>& dw0) {
  std::vector<double> z(rows * vocab), g(rows * vocab, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < vocab; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < hidden; ++k) acc += x[r * hidden + k] * w[j * hidden + k];
      z[r * vocab + j] = store(acc);
    }
  }
  Result out{std::vector<double>(rows), std::vector<double>(rows), std::vector<double>(rows * hidden, 0.0), dw0};
  for (int64_t r = 0; r < rows; ++r) {
    const double* zr = &z[r * vocab];
    const double m = *std::max_element(zr, zr + vocab);
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(zr[j] - m);
    out.lse[r] = m + std::log(sum);
    if (y[r] == kIgnore) {
      out.loss[r] = 0;
      continue;
    }
    out.loss[r] = out.lse[r] - zr[y[r]];
    for (int64_t j = 0; j < vocab; ++j) {
      g[r * vocab + j] = store(s * (std::exp(zr[j] - out.lse[r]) - (j == y[r] ? 1.0 : 0.0)));
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < vocab; ++j) {
      for (int64_t k = 0; k < hidden; ++k) {
        out.dx[r * hidden + k] += g[r * vocab + j] * w[j * hidden + k];
        out.dw[j * hidden + k] += g[r * vocab + j] * x[r * hidden + k];
      }
    }
  }
  return out;
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? d : INFINITY;
}

struct Problem {
  int64_t rows = 7, hidden = 5, vocab = 11;
  std::vector<double> x, w, dw0;
  std::vector<int64_t> y;
  explicit Problem(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0, 1);
    x.resize(rows * hidden);
    w.resize(vocab * hidden);
    dw0.resize(vocab * hidden);
    for (auto& v : x) v = normal(rng);
    for (auto& v : w) v = 0.7 * normal(rng);
    for (auto& v : dw0) v = normal(rng);
    y = {3, kIgnore, 0, 10, 5, 5, kIgnore};
  }
};

TEST(FusedLinearCeRef, ChunkedMatchesUnchunked) {
  const Problem p(1);
  for (double (*store)(double) : {Identity, Eighths}) {
    for (bool accumulate : {false, true}) {
      const Result want = Direct(p.x, p.w, p.y, p.rows, p.hidden, p.vocab, 0.37, store,
                                 accumulate ? p.dw0 : std::vector<double>(p.vocab * p.hidden, 0.0));
      for (int64_t chunk : {1, 3, 7, 100}) {
        std::vector<double> loss(p.rows), lse(p.rows), dx(p.rows * p.hidden, NAN);
        std::vector<double> dw = accumulate ? p.dw0 : std::vector<double>(p.vocab * p.hidden, NAN);
        FusedLinearCrossEntropy(p.x, p.w, p.y, loss, lse, dx, dw, accumulate, 0.37, p.rows, p.hidden, p.vocab, chunk,
                                kIgnore, store);
        SCOPED_TRACE("chunk " + std::to_string(chunk) + " accumulate " + std::to_string(accumulate) +
                     (store == Identity ? " identity" : " eighths"));
        EXPECT_LE(MaxAbsDiff(loss, want.loss), 1e-12);
        EXPECT_LE(MaxAbsDiff(lse, want.lse), 1e-12);
        EXPECT_LE(MaxAbsDiff(dx, want.dx), 1e-12);
        EXPECT_LE(MaxAbsDiff(dw, want.dw), 1e-12);
        EXPECT_EQ(loss[1], 0.0);
        for (int64_t k = 0; k < p.hidden; ++k) EXPECT_EQ(dx[p.hidden + k], 0.0) << "ignored row";
      }
    }
  }
  // The storage rounding must actually reach the result (otherwise the test above proves nothing).
  const Result exact = Direct(p.x, p.w, p.y, p.rows, p.hidden, p.vocab, 0.37, Identity,
                              std::vector<double>(p.vocab * p.hidden, 0.0));
  const Result rounded = Direct(p.x, p.w, p.y, p.rows, p.hidden, p.vocab, 0.37, Eighths,
                                std::vector<double>(p.vocab * p.hidden, 0.0));
  EXPECT_GT(MaxAbsDiff(exact.loss, rounded.loss), 1e-3);
  EXPECT_GT(MaxAbsDiff(exact.dx, rounded.dx), 1e-3);
}

// f(x, W) = s * sum_r loss_r: the reference's dx and dweight must be its gradient.
TEST(FusedLinearCeRef, GradientsMatchFiniteDifferences) {
  const Problem p(2);
  const double s = 1.7;
  const int64_t chunk = 3;
  auto objective = [&](const std::vector<double>& x, const std::vector<double>& w) {
    std::vector<double> loss(p.rows), lse(p.rows), dx(p.rows * p.hidden), dw(p.vocab * p.hidden);
    FusedLinearCrossEntropy(x, w, p.y, loss, lse, dx, dw, false, s, p.rows, p.hidden, p.vocab, chunk, kIgnore,
                            Identity);
    double f = 0;
    for (double l : loss) f += s * l;
    return f;
  };
  std::vector<double> loss(p.rows), lse(p.rows), dx(p.rows * p.hidden), dw(p.vocab * p.hidden);
  FusedLinearCrossEntropy(p.x, p.w, p.y, loss, lse, dx, dw, false, s, p.rows, p.hidden, p.vocab, chunk, kIgnore,
                          Identity);
  const double h = 1e-5;
  for (size_t i = 0; i < p.x.size(); ++i) {
    auto xp = p.x, xm = p.x;
    xp[i] += h;
    xm[i] -= h;
    EXPECT_NEAR(dx[i], (objective(xp, p.w) - objective(xm, p.w)) / (2 * h), 1e-7) << "dx " << i;
  }
  for (size_t i = 0; i < p.w.size(); ++i) {
    auto wp = p.w, wm = p.w;
    wp[i] += h;
    wm[i] -= h;
    EXPECT_NEAR(dw[i], (objective(p.x, wp) - objective(p.x, wm)) / (2 * h), 1e-7) << "dweight " << i;
  }
}

}  // namespace
}  // namespace ftd::kernels::ref
