// GPU test of the production SwiGLU launchers against the float64 reference (kernels/swiglu_ref.h),
// applied to the quantized inputs. Fresh random inputs every run (gate spread wide enough to saturate
// the sigmoid at both ends, plus explicit extremes); outputs poisoned (NaN) before each launch.
//
// Tolerances (MaxRelError: max |got - want| / max |want|):
//   fp32 1e-5: a handful of fp32 operations per element (expf within 2 ulp, IEEE division), ~1e-6.
//   bf16 2^-8: each output is rounded once to bf16 (2^-9 relative to itself); the fp32 error before the
//     rounding can at most move it to the neighbouring bf16 value.
//
// Paths (swiglu.cu): vector = all pointers 16-byte aligned (tail n % V done by scalar threads; V = 8 bf16,
// 4 fp32); scalar = any pointer unaligned. Cases cover both, n < V (tail only), n % V == 0 (no tail),
// many blocks, and in place (out = gate; dgate = gate and dup = up).
#include "kernels/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/swiglu_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

struct Case {
  int64_t n;
  size_t offset = 0;
  bool in_place = false;
};

std::string Name(const Case& c, DType t) {
  return std::string(DTypeName(t)) + " n " + std::to_string(c.n) + (c.offset ? " unaligned" : "") +
         (c.in_place ? " in-place" : "") + SeedNote();
}

// gate ~ N(0, 4) with extremes at the front when n >= 64 (sigmoid saturated both ways; in a tiny tensor
// they would be the whole tensor, and MaxRelError's scale would be silu(-90) ~ 1e-37), up and
// dout ~ N(0, 1); all quantized to the storage type.
void Inputs(const Case& c, DType t, std::vector<double>* gate, std::vector<double>* up, std::vector<double>* dout) {
  std::mt19937_64 rng(TestSeed() + static_cast<uint64_t>(c.n));
  *gate = RandomNormal(static_cast<size_t>(c.n), 0, 4, rng);
  const double extremes[] = {-90.0, 90.0, -17.0, 17.0, 0.0};
  if (c.n >= 64) {
    for (size_t i = 0; i < 5; ++i) (*gate)[i] = extremes[i];
  }
  *up = RandomNormal(static_cast<size_t>(c.n), 0, 1, rng);
  *dout = RandomNormal(static_cast<size_t>(c.n), 0, 1, rng);
  for (auto* v : {gate, up, dout}) {
    for (auto& x : *v) x = Quantize(x, t);
  }
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {{1},
                                          {7},
                                          {8},
                                          {9},
                                          {4097},
                                          {8003},
                                          {3 * 14336},
                                          {37 * 14336 + 5},
                                          {8003, 1},
                                          {4096, 1},
                                          {8003, 0, true},
                                          {3 * 14336, 0, true},
                                          {7, 0, true}};
  return cases;
}

TEST(SwiGluGpu, ForwardMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : Cases()) {
      std::vector<double> gate, up, dout, want;
      Inputs(c, t, &gate, &up, &dout);
      ref::SwiGluForward(gate, up, &want);
      const size_t n = static_cast<size_t>(c.n);
      Tensor g(n, t, c.offset), u(n, t, c.offset), o(n, t, c.offset);
      g.Upload(gate);
      u.Upload(up);
      o.Poison();
      void* out = c.in_place ? g.get() : o.get();
      ASSERT_EQ(cudaSuccess, SwiGluForward(t, g.get(), u.get(), out, c.n, nullptr)) << Name(c, t);
      Check(cudaDeviceSynchronize(), "forward");
      EXPECT_LE(MaxRelError(c.in_place ? g.Download() : o.Download(), want), Tol(t)) << "out, " << Name(c, t);
    }
  }
}

TEST(SwiGluGpu, BackwardMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : Cases()) {
      std::vector<double> gate, up, dout, want_dg, want_du;
      Inputs(c, t, &gate, &up, &dout);
      ref::SwiGluBackward(dout, gate, up, &want_dg, &want_du);
      const size_t n = static_cast<size_t>(c.n);
      Tensor d(n, t, c.offset), g(n, t, c.offset), u(n, t, c.offset), dg(n, t, c.offset), du(n, t, c.offset);
      d.Upload(dout);
      g.Upload(gate);
      u.Upload(up);
      dg.Poison();
      du.Poison();
      Tensor& dg_out = c.in_place ? g : dg;
      Tensor& du_out = c.in_place ? u : du;
      ASSERT_EQ(cudaSuccess, SwiGluBackward(t, d.get(), g.get(), u.get(), dg_out.get(), du_out.get(), c.n, nullptr))
          << Name(c, t);
      Check(cudaDeviceSynchronize(), "backward");
      EXPECT_LE(MaxRelError(dg_out.Download(), want_dg), Tol(t)) << "dgate, " << Name(c, t);
      EXPECT_LE(MaxRelError(du_out.Download(), want_du), Tol(t)) << "dup, " << Name(c, t);
    }
  }
}

// The rows layout of a fused gate|up GEMM output: y [rows, 2 * cols], out [rows, cols], dy [rows, 2 * cols];
// odd cols (scalar path) and cols % 8 == 0 (vector path), against the reference applied per element.
TEST(SwiGluGpu, RowsOfAFusedGateUpMatchReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 8}, {3, 4097}, {37, 1024}, {5, 7}, {129, 352}}) {
      const Case c{rows * cols};
      std::vector<double> gate, up, dout;
      Inputs(c, t, &gate, &up, &dout);
      std::vector<double> want, want_dg, want_du;
      ref::SwiGluForward(gate, up, &want);
      ref::SwiGluBackward(dout, gate, up, &want_dg, &want_du);
      const size_t n = static_cast<size_t>(rows * cols), w = static_cast<size_t>(cols);
      std::vector<double> y(2 * n);  // row r: gate row r, then up row r
      for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
        for (size_t j = 0; j < w; ++j) {
          y[r * 2 * w + j] = gate[r * w + j];
          y[r * 2 * w + w + j] = up[r * w + j];
        }
      }
      Tensor yt(2 * n, t), o(n, t), d(n, t), dy(2 * n, t);
      yt.Upload(y);
      d.Upload(dout);
      o.Poison();
      dy.Poison();
      const size_t es = t == DType::kF32 ? 4 : 2;
      auto at = [&](Tensor& x, size_t elems) { return static_cast<char*>(x.get()) + elems * es; };
      const std::string name = std::string(DTypeName(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
      ASSERT_EQ(cudaSuccess, SwiGluForwardRows(t, yt.get(), at(yt, w), 2 * cols, o.get(), cols, rows, cols, nullptr))
          << name;
      ASSERT_EQ(cudaSuccess, SwiGluBackwardRows(t, d.get(), cols, yt.get(), at(yt, w), 2 * cols, dy.get(), at(dy, w),
                                                rows, cols, nullptr))
          << name;
      Check(cudaDeviceSynchronize(), "rows");
      EXPECT_LE(MaxRelError(o.Download(), want), Tol(t)) << "out, " << name;
      const auto got = dy.Download();
      std::vector<double> got_dg(n), got_du(n);
      for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
        for (size_t j = 0; j < w; ++j) {
          got_dg[r * w + j] = got[r * 2 * w + j];
          got_du[r * w + j] = got[r * 2 * w + w + j];
        }
      }
      EXPECT_LE(MaxRelError(got_dg, want_dg), Tol(t)) << "dgate, " << name;
      EXPECT_LE(MaxRelError(got_du, want_du), Tol(t)) << "dup, " << name;
    }
  }
}

TEST(SwiGluGpu, EmptyAndInvalid) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer a(8, DType::kBF16);
  EXPECT_EQ(cudaSuccess, SwiGluForward(DType::kBF16, nullptr, nullptr, nullptr, 0, nullptr));
  EXPECT_EQ(cudaSuccess, SwiGluBackward(DType::kBF16, nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, SwiGluForward(DType::kBF16, a.get(), a.get(), a.get(), -1, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, SwiGluForward(DType::kBF16, a.get(), nullptr, a.get(), 8, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue,
            SwiGluBackward(DType::kBF16, a.get(), a.get(), a.get(), nullptr, a.get(), 8, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, SwiGluForwardRows(DType::kBF16, a.get(), a.get(), 2, a.get(), 4, 1, 4, nullptr));
  EXPECT_EQ(cudaSuccess, SwiGluForwardRows(DType::kBF16, nullptr, nullptr, 8, nullptr, 4, 0, 4, nullptr));
}

}  // namespace
}  // namespace ftd::kernels
