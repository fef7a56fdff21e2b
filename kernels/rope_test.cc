// GPU test of the production RoPE launchers against the float64 reference (kernels/rope_ref.h), applied
// to the quantized inputs and the fp32 tables the kernel reads. Fresh random inputs every run; outputs
// poisoned (NaN) before each launch.
//
// Tolerances (MaxRelError: max |got - want| / max |want|):
//   fp32 1e-5: two products and a sum per output in fp32, ~2e-7.
//   bf16 2^-8: each output rounded once to bf16 (2^-9 relative to itself); the fp32 error before the
//     rounding can at most move it to the neighbouring bf16 value.
//
// Paths (rope.cu): vector when h = head_dim / 2 is a multiple of V (8 bf16, 4 fp32) and all pointers are
// 16-byte aligned; scalar otherwise. Cases: head_dim 128 (vector, LLaMA), 6 and 2 (scalar), 136 (h = 68:
// vector in fp32, scalar in bf16), odd head counts, seq 1 and 37, batch > 1, more chunks per token than
// threads per block (32 heads in fp32: 512 chunks, 256 threads), unaligned x/out, and in place.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/rope_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

struct Case {
  int64_t batch, seq, heads, head_dim;
  size_t offset = 0;  // elements, applied to x and out (the tables stay aligned)
  bool in_place = false;
};

std::string Name(const Case& c, DType t) {
  return std::string(DTypeName(t)) + " batch " + std::to_string(c.batch) + " seq " + std::to_string(c.seq) + " heads " +
         std::to_string(c.heads) + " head_dim " + std::to_string(c.head_dim) + (c.offset ? " unaligned" : "") +
         (c.in_place ? " in-place" : "") + SeedNote();
}

// LLaMA-style tables: theta[t, i] = t * 500000^(-2i / head_dim), in fp32.
void Tables(int64_t seq, int64_t head_dim, std::vector<double>* cos, std::vector<double>* sin) {
  const int64_t h = head_dim / 2;
  cos->resize(static_cast<size_t>(seq * h));
  sin->resize(static_cast<size_t>(seq * h));
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t i = 0; i < h; ++i) {
      const double theta = static_cast<double>(t) * std::pow(500000.0, -2.0 * static_cast<double>(i) / head_dim);
      (*cos)[t * h + i] = Quantize(std::cos(theta), DType::kF32);
      (*sin)[t * h + i] = Quantize(std::sin(theta), DType::kF32);
    }
  }
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {{1, 1, 1, 128},   {1, 37, 3, 128},          {2, 37, 32, 128},
                                          {1, 37, 8, 128},  {3, 1, 7, 128},           {2, 5, 3, 6},
                                          {1, 37, 1, 2},    {1, 37, 5, 136},          {1, 37, 3, 128, 1},
                                          {1, 37, 3, 6, 1}, {2, 37, 3, 128, 0, true}, {1, 37, 5, 6, 0, true}};
  return cases;
}

void RunRope(const Case& c, DType t, bool backward) {
  std::mt19937_64 rng(TestSeed() + static_cast<uint64_t>(c.batch * 1000003 + c.seq * 1009 + c.heads * 31 + c.head_dim));
  const size_t n = static_cast<size_t>(c.batch * c.seq * c.heads * c.head_dim);
  auto x = RandomNormal(n, 0, 1, rng);
  for (auto& v : x) v = Quantize(v, t);
  std::vector<double> cos, sin, want;
  Tables(c.seq, c.head_dim, &cos, &sin);
  if (backward) {
    ref::RopeBackward(x, cos, sin, c.batch, c.seq, c.heads, c.head_dim, &want);
  } else {
    ref::RopeForward(x, cos, sin, c.batch, c.seq, c.heads, c.head_dim, &want);
  }
  Tensor in(n, t, c.offset), out(n, t, c.offset);
  DeviceBuffer cb(cos.size(), DType::kF32), sb(sin.size(), DType::kF32);
  in.Upload(x);
  out.Poison();
  cb.Upload(cos);
  sb.Upload(sin);
  Tensor& dst = c.in_place ? in : out;
  const auto launch = backward ? RopeBackward : RopeForward;
  ASSERT_EQ(cudaSuccess, launch(t, in.get(), dst.get(), cb.as<float>(), sb.as<float>(), c.batch, c.seq, c.heads,
                                c.head_dim, nullptr))
      << Name(c, t);
  Check(cudaDeviceSynchronize(), "rope");
  EXPECT_LE(MaxRelError(dst.Download(), want), Tol(t)) << (backward ? "dx, " : "out, ") << Name(c, t);
}

TEST(RopeGpu, ForwardMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : Cases()) RunRope(c, t, /*backward=*/false);
  }
}

TEST(RopeGpu, BackwardMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const Case& c : Cases()) RunRope(c, t, /*backward=*/true);
  }
}

TEST(RopeGpu, EmptyAndInvalid) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer x(64, DType::kF32), tab(32, DType::kF32);
  const float* c = tab.as<float>();
  EXPECT_EQ(cudaSuccess, RopeForward(DType::kF32, nullptr, nullptr, nullptr, nullptr, 0, 5, 2, 128, nullptr));
  EXPECT_EQ(cudaSuccess, RopeBackward(DType::kF32, nullptr, nullptr, nullptr, nullptr, 1, 0, 2, 128, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RopeForward(DType::kF32, x.get(), x.get(), c, c, 1, 1, 1, 7, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RopeForward(DType::kF32, x.get(), x.get(), c, c, 1, 1, 1, 0, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RopeForward(DType::kF32, x.get(), x.get(), nullptr, c, 1, 1, 1, 64, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RopeBackward(DType::kF32, x.get(), x.get(), c, c, -1, 1, 1, 64, nullptr));
}

}  // namespace
}  // namespace ftd::kernels
