// The AdamW reference against independent float64 formulations: the algorithm as torch.optim.AdamW's
// documentation writes it (bias-corrected m-hat and v-hat), closed forms for a constant gradient and for
// weight decay alone, and the sum of squares against a direct norm.
#include "kernels/adamw_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

// Several steps of the documented algorithm: theta -= lr * wd * theta; m, v moving averages;
// m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t); theta -= lr * m_hat / (sqrt(v_hat) + eps).
TEST(AdamWRef, MatchesDocumentedAlgorithm) {
  std::mt19937_64 rng(TestSeed());
  ref::AdamWHyper h;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-6;
  h.weight_decay = 0.1;
  h.grad_scale = 0.7;
  auto w = RandomNormal(100, 0, 1, rng);
  std::vector<double> m(100, 0.0), v(100, 0.0);
  auto theta = w, m2 = m, v2 = v;
  for (int t = 1; t <= 5; ++t) {
    const auto grad = RandomNormal(100, 0, 1, rng);
    h.step = t;
    ref::AdamWStep(&w, grad, &m, &v, h);
    for (size_t i = 0; i < theta.size(); ++i) {
      const double g = grad[i] * h.grad_scale;
      theta[i] -= h.lr * h.weight_decay * theta[i];
      m2[i] = h.beta1 * m2[i] + (1 - h.beta1) * g;
      v2[i] = h.beta2 * v2[i] + (1 - h.beta2) * g * g;
      const double m_hat = m2[i] / (1 - std::pow(h.beta1, t)), v_hat = v2[i] / (1 - std::pow(h.beta2, t));
      theta[i] -= h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
    }
    for (size_t i = 0; i < theta.size(); ++i) {
      ASSERT_NEAR(w[i], theta[i], 1e-12) << "step " << t << SeedNote();
      ASSERT_NEAR(m[i], m2[i], 1e-12) << "step " << t << SeedNote();
      ASSERT_NEAR(v[i], v2[i], 1e-12) << "step " << t << SeedNote();
    }
  }
}

// A constant gradient g from zero moments: m_t = (1 - b1^t) g and v_t = (1 - b2^t) g^2, so every step
// moves w by exactly lr * g / (|g| + eps) (no weight decay).
TEST(AdamWRef, ConstantGradientClosedForm) {
  ref::AdamWHyper h;
  h.lr = 1e-3;
  h.eps = 1e-8;
  const std::vector<double> g = {0.5, -2.0, 1e-3, -7.0};
  std::vector<double> w = {1.0, 2.0, 3.0, 4.0}, m(4, 0.0), v(4, 0.0);
  const auto w0 = w;
  for (int t = 1; t <= 10; ++t) {
    h.step = t;
    ref::AdamWStep(&w, g, &m, &v, h);
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_NEAR(m[i], (1 - std::pow(h.beta1, t)) * g[i], 1e-14);
      EXPECT_NEAR(w[i], w0[i] - t * h.lr * g[i] / (std::fabs(g[i]) + h.eps), 1e-12) << "step " << t;
    }
  }
}

// A zero gradient leaves the moments at zero and the update term at 0 / eps = 0: only the decay acts,
// w_t = w_0 (1 - lr wd)^t.
TEST(AdamWRef, WeightDecayAlone) {
  ref::AdamWHyper h;
  h.lr = 0.1;
  h.weight_decay = 0.5;
  std::vector<double> w = {1.0, -3.0}, m(2, 0.0), v(2, 0.0);
  for (int t = 1; t <= 4; ++t) {
    h.step = t;
    ref::AdamWStep(&w, {0.0, 0.0}, &m, &v, h);
  }
  EXPECT_NEAR(w[0], std::pow(0.95, 4), 1e-15);
  EXPECT_NEAR(w[1], -3.0 * std::pow(0.95, 4), 1e-15);
}

TEST(AdamWRef, SumSquaresIsSquaredNorm) {
  std::mt19937_64 rng(TestSeed());
  const std::vector<std::vector<double>> grads = {RandomNormal(5, 0, 1, rng), {}, RandomNormal(17, 0, 2, rng)};
  double norm = 0;
  for (const auto& g : grads) {
    for (double x : g) norm = std::hypot(norm, x);
  }
  EXPECT_NEAR(ref::SumSquares(grads), norm * norm, 1e-12 * norm * norm) << SeedNote();
}

}  // namespace
}  // namespace ftd::kernels
