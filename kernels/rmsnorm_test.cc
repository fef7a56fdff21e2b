// GPU test of the production RMSNorm launchers against the float64 reference (kernels/rmsnorm_ref.h),
// applied to the quantized inputs (the values the kernel read). Fresh random inputs every run; every
// output is poisoned (NaN) before each launch so an element the kernel fails to write fails.
//
// eps: every case has rows whose mean square is comparable to eps (x scaled by 0.3, 1 and 3 times
// sqrt(eps)), beside rows of x ~ N(0, 2). In those rows eps moves y and rstd by 5% to 75%, far beyond the
// tolerances, so a kernel that ignores eps or uses another value fails every case. The cases rotate over
// eps 1e-5 (LLaMA-3), 1e-6 and an odd 3.1e-4; ForwardHonoursEachEps runs every path with all three.
//
// Tolerances (MaxRelError: max |got - want| / max |want|):
//   fp32 outputs 1e-5: fp32 arithmetic (~6e-8 per operation) over row sums of <= 16392 terms, reduced
//     as per-thread runs plus trees, stays near 1e-6; dw adds <= 7000 rows in short runs the same way.
//   bf16 outputs 2^-8: the output is rounded to bf16 (2^-9 relative to itself, hence to the maximum),
//     and the fp32 error before the rounding (~1e-6) can at most move it to the neighbouring bf16 value.
//   rstd (fp32 in both dtypes) 1e-5 relative to each row's own value (rows differ in scale by 10^3),
//     computed from the quantized x.
//
// Which kernel path a case takes (see rmsnorm.cu): pipelined = n % V == 0 (V = 8 bf16, 4 fp32), aligned
// pointers, n / V <= 1024 (on sm_90 and newer); looped vector = aligned, n % V == 0, n / V > 1024; looped
// scalar = otherwise. A plan made for a device without the bulk copy engine (DeviceProps.cc_major 8)
// takes the looped paths for every case (LoopedPlanMatchesReference), as on devices before sm_90.
// Pipelined block shapes covered (T threads x K vectors each; the forward always
// takes K = 2, the backward the fewest that fit): bf16 n 4096 = 256 x 2 forward, 512 x 1 backward;
// n 8192 = 512 x 2; n 4104 = 288 x 2 (thread 224 owns the last vector as its second); n 1024 = 64 x 2
// forward, 128 x 1 backward; n 64 and n 8 = one warp, mostly idle; fp32 n 4096 = 512 x 2, n 1024 =
// 128 x 2 forward, 256 x 1 backward. The ring of S <= 8 stages wraps (a block's row j uses stage j % S
// at parity j / S) only when a block gets more than S rows: in the backward, whose grid is what is
// resident at once (a few hundred blocks at n 4096), 7000 rows there use every stage three times or more,
// in place too; in the forward (at most 4 rows a block, 1 when rows <= the blocks resident at once), at
// fp32 n 4096, where registers allow 4 blocks a multiprocessor and so 3 stages of 16 KB.
#include "kernels/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/rmsnorm_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

constexpr float kEps[] = {1e-5f, 1e-6f, 3.1e-4f};

struct Case {
  int64_t rows, n;
  size_t offset = 0;      // elements; 1 = unaligned pointers
  bool in_place = false;  // y aliases x (forward), dx aliases dy (backward)
};

std::string Name(const Case& c, DType t, double eps = 0) {
  return std::string(DTypeName(t)) + " rows " + std::to_string(c.rows) + " n " + std::to_string(c.n) +
         (c.offset ? " unaligned" : "") + (c.in_place ? " in-place" : "") +
         (eps > 0 ? " eps " + std::to_string(eps) : "") + SeedNote();
}

// The plan for `c` on the current device (or as if on `props`).
RmsNormPlan PlanFor(const Case& c, DType t, const DeviceProps& props) {
  RmsNormPlan plan;
  Check(PlanRmsNorm(props, t, c.n, &plan), "PlanRmsNorm");
  return plan;
}

// x for a forward at `eps`: rows cycle through root-mean-squares of sqrt(eps), 2, 0.3 sqrt(eps) and
// 3 sqrt(eps), so in three rows of four eps changes y and rstd by 5% (3 sqrt(eps)) to 75% (0.3 sqrt(eps)).
std::vector<double> EpsSensitiveX(const Case& c, double eps, std::mt19937_64& rng) {
  const double scale[4] = {std::sqrt(eps), 2, 0.3 * std::sqrt(eps), 3 * std::sqrt(eps)};
  std::vector<double> x = RandomNormal(static_cast<size_t>(c.rows * c.n), 0, 1, rng);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.n; ++i) x[static_cast<size_t>(r * c.n + i)] *= scale[r % 4];
  }
  return x;
}

void RunForward(const Case& c, DType t, float eps, const DeviceProps& props) {
  std::mt19937_64 rng(TestSeed() + static_cast<uint64_t>(c.rows * 7919 + c.n));
  const size_t total = static_cast<size_t>(c.rows * c.n);
  const auto x = Quantized(EpsSensitiveX(c, eps, rng), t);
  const auto w = Quantized(RandomNormal(static_cast<size_t>(c.n), 0.5, 1, rng), t);
  std::vector<double> want_y, want_rstd;
  ref::RmsNormForward(x, w, c.rows, c.n, static_cast<double>(eps), &want_y, &want_rstd);

  Tensor xb(total, t, c.offset), wb(static_cast<size_t>(c.n), t, c.offset), yb(total, t, c.offset);
  DeviceBuffer rstd(static_cast<size_t>(c.rows), DType::kF32);
  xb.Upload(x);
  wb.Upload(w);
  yb.Poison();
  rstd.Poison();
  void* y = c.in_place ? xb.get() : yb.get();
  ASSERT_EQ(cudaSuccess, RmsNormForward(PlanFor(c, t, props), xb.get(), wb.get(), y, rstd.as<float>(), c.rows, eps,
                                        nullptr))
      << Name(c, t, eps);
  Check(cudaDeviceSynchronize(), "forward");
  const auto got_y = c.in_place ? xb.Download() : yb.Download();
  EXPECT_LE(MaxRelError(got_y, want_y), Tol(t)) << "y, " << Name(c, t, eps);
  EXPECT_LE(MaxElementRelError(rstd.Download(), want_rstd), 1e-5) << "rstd, " << Name(c, t, eps);
}

void RunBackward(const Case& c, DType t, const DeviceProps& props) {
  std::mt19937_64 rng(TestSeed() + static_cast<uint64_t>(c.rows * 104729 + c.n));
  const size_t total = static_cast<size_t>(c.rows * c.n);
  const auto x = Quantized(RandomNormal(total, 0, 2, rng), t);
  const auto w = Quantized(RandomNormal(static_cast<size_t>(c.n), 0.5, 1, rng), t);
  const auto dy = Quantized(RandomNormal(total, 0, 1, rng), t);
  std::vector<double> y, rstd;
  ref::RmsNormForward(x, w, c.rows, c.n, 1e-5, &y, &rstd);
  rstd = Quantized(rstd, DType::kF32);  // the fp32 values the kernel reads
  std::vector<double> want_dx, want_dw;
  ref::RmsNormBackward(dy, x, w, rstd, c.rows, c.n, &want_dx, &want_dw);

  Tensor xb(total, t, c.offset), wb(static_cast<size_t>(c.n), t, c.offset), dyb(total, t, c.offset),
      dxb(total, t, c.offset), dwb(static_cast<size_t>(c.n), t);
  DeviceBuffer rb(static_cast<size_t>(c.rows), DType::kF32);
  DeviceBuffer ws(RmsNormBackwardWorkspaceBytes(c.rows, c.n) / sizeof(float), DType::kF32);
  xb.Upload(x);
  wb.Upload(w);
  dyb.Upload(dy);
  rb.Upload(rstd);
  dxb.Poison();
  dwb.Poison();
  ws.Poison();
  void* dx = c.in_place ? dyb.get() : dxb.get();
  ASSERT_EQ(cudaSuccess, RmsNormBackward(PlanFor(c, t, props), dyb.get(), xb.get(), wb.get(), rb.as<float>(), dx,
                                         dwb.get(), ws.get(), c.rows, nullptr))
      << Name(c, t);
  Check(cudaDeviceSynchronize(), "backward");
  const auto got_dx = c.in_place ? dyb.Download() : dxb.Download();
  EXPECT_LE(MaxRelError(got_dx, want_dx), Tol(t)) << "dx, " << Name(c, t);
  EXPECT_LE(MaxRelError(dwb.Download(), want_dw), Tol(t)) << "dw, " << Name(c, t);
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      // pipelined path: LLaMA width, odd row counts, many rows per block (2048; 7000: the ring of stages
      // wraps several times), small and ragged widths, two vectors per thread (8192 bf16)
      {1, 4096},
      {3, 4096},
      {37, 4096},
      {257, 4096},
      {2048, 4096},
      {7000, 4096},
      {37, 1024},
      {3000, 1024},
      {5, 64},
      {37, 8},
      {3, 4104},
      {67, 8192},
      // looped vector path: more than 1024 vectors per row (bf16 8200 = 1025 x 8; fp32 8200 and 4100)
      {3, 8200},
      {37, 4100},
      // looped scalar path: odd widths, many rows per block (1100), unaligned pointers with an aligned width.
      // (No n = 1: there dx = rstd * g * eps / (x^2 + eps), a cancellation that no fp32 code resolves.)
      {1, 4097},
      {3, 4097},
      {37, 4097},
      {257, 4097},
      {1100, 4097},
      {3, 6},
      {1, 5},
      {37, 4096, 1},
      // in place
      {37, 4096, 0, true},
      {7000, 4096, 0, true},
      {37, 4097, 0, true}};
  return cases;
}

TEST(RmsNormGpu, ForwardMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (size_t i = 0; i < Cases().size(); ++i) RunForward(Cases()[i], t, kEps[i % 3], props);
  }
}

// Each eps on each path: pipelined (4096; 1024 fp32), looped vector (8200), looped scalar (4097, unaligned).
TEST(RmsNormGpu, ForwardHonoursEachEps) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : std::vector<Case>{{5, 4096}, {4, 1024}, {4, 8200}, {4, 4097}, {4, 4096, 1}}) {
      for (float eps : kEps) RunForward(c, t, eps, props);
    }
  }
}

TEST(RmsNormGpu, BackwardMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : Cases()) RunBackward(c, t, props);
  }
}

// A plan for a device without the bulk copy engine (before sm_90): the looped paths on every case, and the
// dw reduction launched without programmatic dependent launch.
TEST(RmsNormGpu, LoopedPlanMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  DeviceProps props = CurrentProps();
  props.cc_major = 8;
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (size_t i = 0; i < Cases().size(); ++i) {
      ASSERT_FALSE(PlanFor(Cases()[i], t, props).fwd.ok) << Name(Cases()[i], t);
      RunForward(Cases()[i], t, kEps[i % 3], props);
      RunBackward(Cases()[i], t, props);
    }
  }
}

// dw is reduced without atomics: two launches on the same inputs give bitwise the same dw and dx.
TEST(RmsNormGpu, BackwardIsDeterministic) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {4096, 4097}) {
      const int64_t rows = 2048;
      const RmsNormPlan plan = PlanFor({rows, n}, t, props);
      const size_t total = static_cast<size_t>(rows * n);
      std::mt19937_64 rng(TestSeed());
      DeviceBuffer x(total, t), w(static_cast<size_t>(n), t), dy(total, t),
          rstd(static_cast<size_t>(rows), DType::kF32);
      x.Upload(RandomNormal(total, 0, 1, rng));
      w.Upload(RandomNormal(static_cast<size_t>(n), 1, 0.5, rng));
      dy.Upload(RandomNormal(total, 0, 1, rng));
      rstd.Upload(RandomNormal(static_cast<size_t>(rows), 1, 0.1, rng));
      DeviceBuffer ws(RmsNormBackwardWorkspaceBytes(rows, n) / sizeof(float), DType::kF32);
      std::vector<double> first_dw, first_dx;
      for (int run = 0; run < 2; ++run) {
        DeviceBuffer dx(total, t), dw(static_cast<size_t>(n), t);
        dx.Poison();
        dw.Poison();
        ASSERT_EQ(cudaSuccess, RmsNormBackward(plan, dy.get(), x.get(), w.get(), rstd.as<float>(), dx.get(), dw.get(),
                                               ws.get(), rows, nullptr));
        Check(cudaDeviceSynchronize(), "backward");
        if (run == 0) {
          first_dw = dw.Download();
          first_dx = dx.Download();
        } else {
          EXPECT_EQ(0, std::memcmp(first_dw.data(), dw.Download().data(), first_dw.size() * sizeof(double)))
              << DTypeName(t) << " n " << n << SeedNote();
          EXPECT_EQ(0, std::memcmp(first_dx.data(), dx.Download().data(), first_dx.size() * sizeof(double)))
              << DTypeName(t) << " n " << n << SeedNote();
        }
      }
    }
  }
}

// rows == 0: the forward writes nothing and succeeds; the backward's dw is a sum over no rows, 0.
TEST(RmsNormGpu, ZeroRows) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  for (DType t : {DType::kF32, DType::kBF16}) {
    const RmsNormPlan plan = PlanFor({0, 4097}, t, props);
    DeviceBuffer x(1, t), w(4097, t), rstd(1, DType::kF32), dw(4097, t);
    EXPECT_EQ(cudaSuccess, RmsNormForward(plan, x.get(), w.get(), x.get(), rstd.as<float>(), 0, 1e-5f, nullptr));
    dw.Poison();
    ASSERT_EQ(cudaSuccess,
              RmsNormBackward(plan, nullptr, nullptr, w.get(), nullptr, nullptr, dw.get(), nullptr, 0, nullptr));
    Check(cudaDeviceSynchronize(), "backward");
    for (double v : dw.Download()) ASSERT_EQ(0.0, v) << DTypeName(t);
  }
}

TEST(RmsNormGpu, RejectsInvalidArguments) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  RmsNormPlan plan;
  EXPECT_EQ(cudaErrorInvalidValue, PlanRmsNorm(props, DType::kF32, 0, &plan));
  DeviceProps other = props;
  other.device = props.device + 1;
  EXPECT_EQ(cudaErrorInvalidDevice, PlanRmsNorm(other, DType::kF32, 64, &plan));
  DeviceBuffer x(64, DType::kF32), rstd(1, DType::kF32), ws(RmsNormBackwardWorkspaceBytes(1, 64) / 4 + 1, DType::kF32);
  float* r = rstd.as<float>();
  const RmsNormPlan unplanned;
  EXPECT_EQ(cudaErrorInvalidValue, RmsNormForward(unplanned, x.get(), x.get(), x.get(), r, 1, 1e-5f, nullptr));
  ASSERT_EQ(cudaSuccess, PlanRmsNorm(props, DType::kF32, 64, &plan));
  RmsNormPlan elsewhere = plan;
  elsewhere.device = props.device + 1;  // a plan made for another device
  EXPECT_EQ(cudaErrorInvalidValue, RmsNormForward(elsewhere, x.get(), x.get(), x.get(), r, 1, 1e-5f, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RmsNormForward(plan, x.get(), x.get(), x.get(), r, -1, 1e-5f, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RmsNormForward(plan, nullptr, x.get(), x.get(), r, 1, 1e-5f, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue,
            RmsNormBackward(plan, x.get(), x.get(), x.get(), r, x.get(), x.get(), nullptr, 1, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RmsNormBackward(plan, x.get(), x.get(), x.get(), r, x.get(), x.get(),
                                                   static_cast<char*>(ws.get()) + 2, 1, nullptr));
  EXPECT_EQ(0u, RmsNormBackwardWorkspaceBytes(1, 0));
}

}  // namespace
}  // namespace ftd::kernels
