// GPU test of the tiled FP8 casts and the byte transpose (kernels/fp8_tiles.h) against the reference
// (kernels/fp8_tiles_ref.h, fp8_cast_ref.h): amax and scale exactly, and every byte of the row-major
// and transposed outputs exactly given the scale. Fresh random inputs every run; outputs poisoned with
// 0xFF (a negative NaN code, which the kernels never write for finite inputs) before each launch.
//
// Cases: bf16 and fp32 sources, E4M3 and E5M2; concatenation along columns (the projections' output
// gradients, with a null source, a leading dimension past the width, zero rows of padding) and along
// rows (the projections' weights, the scale from their given amax values); widths and heights off the
// 64 tile and off the vector (scalar paths), unaligned sources; either output alone and both; NaN and
// +-Inf; all zeros. The byte transpose on odd and aligned sizes, aligned and not.
#include "kernels/fp8_tiles.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/fp8_cast_ref.h"
#include "kernels/fp8_tiles_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

struct Src {
  int64_t rows, cols, ld;
  bool null = false;
  size_t offset = 0;  // elements into the allocation: 1 makes it unaligned
};

struct Case {
  std::string name;
  Fp8Concat concat;
  std::vector<Src> srcs;
  int64_t rows_out = 0;
  bool out = true, out_t = true;
  Fp8ScaleFrom from = Fp8ScaleFrom::kCompute;
  bool specials = false, zeros = false;
};

std::vector<Case> Cases() {
  using C = Fp8Concat;
  std::vector<Case> v;
  v.push_back({"one source, tile multiple", C::kCols, {{128, 192, 192}}});
  v.push_back({"q/k/v gradients", C::kCols, {{200, 256, 256}, {200, 64, 64}, {200, 64, 64}}, 208});
  v.push_back({"null source and ld", C::kCols, {{77, 48, 64}, {77, 16, 16, true}, {77, 80, 88}}, 80});
  v.push_back({"odd widths (scalar)", C::kCols, {{33, 13, 13}, {33, 7, 9}}, 0});
  v.push_back({"unaligned (scalar)", C::kCols, {{65, 64, 64, false, 1}, {65, 32, 32}}, 80});
  v.push_back({"out only", C::kCols, {{100, 96, 96}}, 112, true, false});
  v.push_back({"out_t only", C::kCols, {{100, 96, 96}}, 112, false, true});
  v.push_back({"nan/inf", C::kCols, {{64, 128, 128}, {64, 64, 64}}, 0, true, true, Fp8ScaleFrom::kCompute, true});
  v.push_back({"zeros", C::kCols, {{48, 64, 64}}, 0, true, true, Fp8ScaleFrom::kCompute, false, true});
  v.push_back({"weights, given amax", C::kRows, {{256, 192, 192}, {64, 192, 192}, {64, 192, 192}}, 0, false, true,
               Fp8ScaleFrom::kGiven});
  v.push_back({"weights, odd, given amax", C::kRows, {{70, 40, 40}, {3, 40, 40}}, 0, true, true,
               Fp8ScaleFrom::kGiven});
  v.push_back({"many tiles", C::kCols, {{1040, 1024, 1024}, {1040, 1024, 1024}}, 0});
  return v;
}

std::string Name(const Case& c, DType t, Fp8Format f) {
  return c.name + " " + DTypeName(t) + "->" + Fp8FormatName(f) + SeedNote();
}

std::vector<uint8_t> Download(const DeviceBuffer& b, size_t n) {
  std::vector<uint8_t> h(n);
  if (n > 0) Check(cudaMemcpy(h.data(), b.get(), n, cudaMemcpyDeviceToHost), "download bytes");
  return h;
}

float DownloadScalar(const DeviceBuffer& b) {
  float v;
  Check(cudaMemcpy(&v, b.get(), 4, cudaMemcpyDeviceToHost), "download scalar");
  return v;
}

size_t FirstMismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, size_t* bad) {
  *bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && (*bad)++ == 0) first = i;
  }
  return first;
}

void RunCase(const DeviceProps& props, const Case& c, DType t, Fp8Format f, uint64_t salt) {
  std::mt19937_64 rng(TestSeed() + salt);
  std::vector<std::vector<float>> host(c.srcs.size());
  std::vector<Tensor> dev;
  std::vector<DeviceBuffer> amaxes;
  std::vector<ref::TileSource> rs;
  Fp8TileCast p;
  p.dtype = t;
  p.format = f;
  p.concat = c.concat;
  p.scale_from = c.from;
  p.num_sources = static_cast<int>(c.srcs.size());
  p.rows_out = c.rows_out;
  float given = 0;
  for (size_t i = 0; i < c.srcs.size(); ++i) {
    const Src& s = c.srcs[i];
    const size_t n = static_cast<size_t>(s.rows * s.ld);
    std::vector<double> x = RandomNormal(n, 0, 2.0 + static_cast<double>(i), rng);
    if (c.zeros) std::fill(x.begin(), x.end(), 0.0);
    if (c.specials) {
      for (size_t k = 0; k < n; k += 61) x[k] = std::numeric_limits<double>::quiet_NaN();
      for (size_t k = 17; k < n; k += 67) x[k] = (k % 2 ? 1 : -1) * std::numeric_limits<double>::infinity();
    }
    x = Quantized(x, t);
    host[i].assign(x.begin(), x.end());
    dev.emplace_back(n, t, s.offset);
    dev.back().Upload(x);
    // A weight's amax as its forward cast found it: of its own elements (the given-amax case).
    float a = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t k = 0; k < s.cols; ++k) {
        const float v = host[i][static_cast<size_t>(r * s.ld + k)];
        if (std::isfinite(v)) a = std::max(a, std::fabs(v));
      }
    }
    given = std::max(given, a);
    amaxes.emplace_back(1, DType::kF32);
    Check(cudaMemcpy(amaxes.back().get(), &a, 4, cudaMemcpyHostToDevice), "upload amax");
    rs.push_back({s.null ? nullptr : &host[i], s.rows, s.cols, s.ld});
  }
  for (size_t i = 0; i < c.srcs.size(); ++i) {
    p.sources[i] = {c.srcs[i].null ? nullptr : dev[i].get(), c.srcs[i].rows, c.srcs[i].cols, c.srcs[i].ld,
                    c.from == Fp8ScaleFrom::kGiven ? amaxes[i].as<float>() : nullptr};
  }
  int64_t R = 0, C = 0;
  const std::vector<float> m = ref::ConcatMatrix(rs, c.concat, c.rows_out, &R, &C);
  const size_t bytes = static_cast<size_t>(R * C);
  DeviceBuffer out(bytes / 4 + 1, DType::kF32), out_t(bytes / 4 + 1, DType::kF32), amax(1, DType::kF32),
      scale_inv(1, DType::kF32);
  for (auto* b : {&out, &out_t, &amax, &scale_inv}) b->Poison();
  p.out = c.out ? out.as<uint8_t>() : nullptr;
  p.out_t = c.out_t ? out_t.as<uint8_t>() : nullptr;
  p.amax = amax.as<float>();
  p.scale_inv = scale_inv.as<float>();
  ASSERT_EQ(cudaSuccess, Fp8CastTiles(props, p, nullptr)) << Name(c, t, f);
  Check(cudaDeviceSynchronize(), "Fp8CastTiles");

  const float want_amax = c.from == Fp8ScaleFrom::kGiven ? given : ref::AmaxFinite(m);
  const float scale = ref::Fp8Scale(want_amax, f);
  ASSERT_EQ(DownloadScalar(amax), want_amax) << "amax, " << Name(c, t, f);
  ASSERT_EQ(DownloadScalar(scale_inv), 1.f / scale) << "scale_inv, " << Name(c, t, f);
  const std::vector<uint8_t> want = ref::Fp8Cast(m, scale, f);
  size_t bad = 0;
  if (c.out) {
    const auto got = Download(out, bytes);
    const size_t i = FirstMismatch(got, want, &bad);
    EXPECT_EQ(bad, 0u) << "out, first at (" << i / C << ", " << i % C << "): value " << m[i] << " got "
                       << int{got[i]} << " want " << int{want[i]} << ", " << Name(c, t, f);
  }
  if (c.out_t) {
    const auto got = Download(out_t, bytes), want_t = ref::TransposeBytes(want, R, C);
    const size_t i = FirstMismatch(got, want_t, &bad);
    EXPECT_EQ(bad, 0u) << "out_t, first at (" << i / R << ", " << i % R << ") got " << int{got[i]} << " want "
                       << int{want_t[i]} << ", " << Name(c, t, f);
  }
}

TEST(Fp8TilesGpu, CastsMatchReferenceExactly) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  uint64_t salt = 0;
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      for (const Case& c : Cases()) RunCase(props, c, t, f, ++salt);
    }
  }
}

TEST(Fp8TilesGpu, TransposeMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  std::mt19937_64 rng(TestSeed());
  struct T {
    int64_t rows, cols;
    size_t offset;
  };
  for (const T& c : {T{1, 1, 0}, T{3, 70, 0}, T{65, 17, 0}, T{128, 64, 0}, T{1040, 4096, 0}, T{64, 128, 1},
                     T{8200, 16, 0}}) {
    const size_t n = static_cast<size_t>(c.rows * c.cols);
    std::vector<uint8_t> in(n);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    DeviceBuffer din(n / 4 + 2, DType::kF32), dout(n / 4 + 2, DType::kF32);
    uint8_t* pin = din.as<uint8_t>() + c.offset;
    uint8_t* pout = dout.as<uint8_t>() + c.offset;
    Check(cudaMemcpy(pin, in.data(), n, cudaMemcpyHostToDevice), "upload");
    dout.Poison();
    ASSERT_EQ(cudaSuccess, Fp8Transpose(props, pin, c.rows, c.cols, pout, nullptr));
    Check(cudaDeviceSynchronize(), "Fp8Transpose");
    std::vector<uint8_t> got(n);
    Check(cudaMemcpy(got.data(), pout, n, cudaMemcpyDeviceToHost), "download");
    EXPECT_EQ(got, ref::TransposeBytes(in, c.rows, c.cols))
        << c.rows << " x " << c.cols << (c.offset ? " unaligned" : "") << SeedNote();
  }
}

TEST(Fp8TilesGpu, RefusesBadArguments) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  DeviceBuffer x(64, DType::kBF16), o(64, DType::kF32), s(2, DType::kF32);
  Fp8TileCast p;
  p.num_sources = 2;
  p.sources[0] = {x.get(), 4, 8, 8};
  p.sources[1] = {x.get(), 5, 8, 8};  // rows differ along columns
  p.out = o.as<uint8_t>();
  p.amax = s.as<float>();
  p.scale_inv = s.as<float>() + 1;
  EXPECT_EQ(cudaErrorInvalidValue, Fp8CastTiles(props, p, nullptr));
  p.sources[1].rows = 4;
  p.sources[1].ld = 4;  // ld below the width
  EXPECT_EQ(cudaErrorInvalidValue, Fp8CastTiles(props, p, nullptr));
  p.sources[1].ld = 8;
  p.rows_out = 2;  // fewer rows than the data
  EXPECT_EQ(cudaErrorInvalidValue, Fp8CastTiles(props, p, nullptr));
  p.rows_out = 0;
  p.scale_from = Fp8ScaleFrom::kGiven;  // no amax given
  EXPECT_EQ(cudaErrorInvalidValue, Fp8CastTiles(props, p, nullptr));
  p.scale_from = Fp8ScaleFrom::kCompute;
  p.out = nullptr;  // no output
  EXPECT_EQ(cudaErrorInvalidValue, Fp8CastTiles(props, p, nullptr));
}

}  // namespace
}  // namespace ftd::kernels
