// The RoPE reference against independent float64 formulas: the forward against complex multiplication
// (the pair (x[i], x[i + h]) as x[i] + i x[i + h], rotated by e^{i theta}) and against HF's
// x * cos + rotate_half(x) * sin on full-width tables; the backward against central finite differences
// of the forward (on arbitrary, not unit-norm, tables: the backward is the transpose, not just the inverse).
#include "kernels/rope_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <random>
#include <vector>

#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

TEST(RopeRef, ForwardIsComplexRotation) {
  std::mt19937_64 rng(TestSeed());
  const int64_t batch = 2, seq = 5, heads = 3, d = 8, h = d / 2;
  const auto x = RandomNormal(batch * seq * heads * d, 0, 1, rng);
  const auto theta = RandomNormal(seq * h, 0, 3, rng);
  std::vector<double> cos(theta.size()), sin(theta.size()), out;
  for (size_t i = 0; i < theta.size(); ++i) {
    cos[i] = std::cos(theta[i]);
    sin[i] = std::sin(theta[i]);
  }
  ref::RopeForward(x, cos, sin, batch, seq, heads, d, &out);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t hd = 0; hd < heads; ++hd) {
        const int64_t row = ((b * seq + t) * heads + hd) * d;
        for (int64_t i = 0; i < h; ++i) {
          const std::complex<double> z(x[row + i], x[row + i + h]);
          const std::complex<double> r = z * std::polar(1.0, theta[t * h + i]);
          EXPECT_NEAR(out[row + i], r.real(), 1e-12) << SeedNote();
          EXPECT_NEAR(out[row + i + h], r.imag(), 1e-12) << SeedNote();
        }
      }
    }
  }
}

TEST(RopeRef, ForwardMatchesRotateHalf) {
  std::mt19937_64 rng(TestSeed());
  const int64_t seq = 4, heads = 2, d = 6, h = d / 2;
  const auto x = RandomNormal(seq * heads * d, 0, 1, rng);
  const auto cos = RandomNormal(seq * h, 0, 1, rng), sin = RandomNormal(seq * h, 0, 1, rng);
  std::vector<double> out;
  ref::RopeForward(x, cos, sin, 1, seq, heads, d, &out);
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t hd = 0; hd < heads; ++hd) {
      const double* xr = x.data() + (t * heads + hd) * d;
      for (int64_t j = 0; j < d; ++j) {
        const double cos_full = cos[t * h + j % h], sin_full = sin[t * h + j % h];  // cat(freqs, freqs)
        const double rotated = j < h ? -xr[j + h] : xr[j - h];                      // cat(-x2, x1)
        EXPECT_NEAR(out[(t * heads + hd) * d + j], xr[j] * cos_full + rotated * sin_full, 1e-12) << SeedNote();
      }
    }
  }
}

TEST(RopeRef, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(TestSeed());
  const int64_t batch = 2, seq = 3, heads = 2, d = 4;
  const int64_t n = batch * seq * heads * d;
  const auto x = RandomNormal(n, 0, 1, rng), dout = RandomNormal(n, 0, 1, rng);
  const auto cos = RandomNormal(seq * d / 2, 0, 1, rng), sin = RandomNormal(seq * d / 2, 0, 1, rng);
  auto loss = [&](const std::vector<double>& xv) {
    std::vector<double> out;
    ref::RopeForward(xv, cos, sin, batch, seq, heads, d, &out);
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += dout[i] * out[i];
    return l;
  };
  std::vector<double> dx;
  ref::RopeBackward(dout, cos, sin, batch, seq, heads, d, &dx);
  const double step = 1e-4;
  for (int64_t i = 0; i < n; ++i) {
    auto xp = x, xm = x;
    xp[i] += step;
    xm[i] -= step;
    const double fd = (loss(xp) - loss(xm)) / (2 * step);
    EXPECT_NEAR(dx[i], fd, 1e-8 * (1 + std::fabs(fd))) << "dx[" << i << "]" << SeedNote();
  }
}

}  // namespace
}  // namespace ftd::kernels
