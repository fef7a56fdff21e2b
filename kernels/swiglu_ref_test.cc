// The SwiGLU reference against independent float64 formulas: the forward against silu written through
// tanh (sigmoid(g) = (1 + tanh(g / 2)) / 2), the backward against central finite differences of the
// forward (L = sum(dout * out), so dL/dgate and dL/dup are exactly what dgate and dup must be).
#include "kernels/swiglu_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

TEST(SwiGluRef, ForwardMatchesTanhFormula) {
  std::mt19937_64 rng(TestSeed());
  auto gate = RandomNormal(1000, 0, 4, rng), up = RandomNormal(1000, 0, 1, rng);
  gate.insert(gate.end(), {-60.0, -20.0, 0.0, 20.0, 60.0});
  up.insert(up.end(), {1.0, -2.0, 3.0, 0.5, -1.0});
  std::vector<double> out;
  ref::SwiGluForward(gate, up, &out);
  for (size_t i = 0; i < gate.size(); ++i) {
    const double want = gate[i] * 0.5 * (1.0 + std::tanh(gate[i] / 2)) * up[i];
    ASSERT_NEAR(out[i], want, 1e-13 * (1 + std::fabs(want))) << "gate " << gate[i] << SeedNote();
  }
}

TEST(SwiGluRef, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(TestSeed());
  auto gate = RandomNormal(200, 0, 3, rng), up = RandomNormal(200, 0, 1, rng), dout = RandomNormal(200, 0, 1, rng);
  std::vector<double> dgate, dup;
  ref::SwiGluBackward(dout, gate, up, &dgate, &dup);
  const double h = 1e-5;
  auto loss = [&](const std::vector<double>& g, const std::vector<double>& u) {
    std::vector<double> out;
    ref::SwiGluForward(g, u, &out);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += dout[i] * out[i];
    return l;
  };
  for (size_t i = 0; i < gate.size(); ++i) {
    auto gp = gate, gm = gate, upp = up, upm = up;
    gp[i] += h;
    gm[i] -= h;
    upp[i] += h;
    upm[i] -= h;
    const double fd_g = (loss(gp, up) - loss(gm, up)) / (2 * h);
    const double fd_u = (loss(gate, upp) - loss(gate, upm)) / (2 * h);
    EXPECT_NEAR(dgate[i], fd_g, 1e-7 * (1 + std::fabs(fd_g))) << "dgate[" << i << "]" << SeedNote();
    EXPECT_NEAR(dup[i], fd_u, 1e-7 * (1 + std::fabs(fd_u))) << "dup[" << i << "]" << SeedNote();
  }
}

}  // namespace
}  // namespace ftd::kernels
