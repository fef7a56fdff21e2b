// The FP8 reference against independent descriptions of the formats: fixed code points from the OCP
// FP8 specification, every finite code round-tripping, monotonic codes, and the CUDA toolkit's own
// host-side conversion (cuda_fp8.h, written with bit manipulation rather than a search) on every bf16
// value at several scales.
#include "kernels/fp8_cast_ref.h"

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/rmsnorm_ref.h"
#include "kernels/swiglu_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

constexpr Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};

uint8_t Toolkit(float v, Fp8Format f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

bool IsNaNCode(uint8_t b, Fp8Format f) { return std::isnan(ref::Fp8ToDouble(b, f)); }

TEST(Fp8Ref, CodePoints) {
  using F = Fp8Format;
  EXPECT_EQ(ref::Fp8ToDouble(0x7E, F::kE4M3), 448.0);
  EXPECT_EQ(ref::Fp8ToDouble(0x7B, F::kE5M2), 57344.0);
  EXPECT_EQ(ref::Fp8ToDouble(0x38, F::kE4M3), 1.0);
  EXPECT_EQ(ref::Fp8ToDouble(0x3C, F::kE5M2), 1.0);
  EXPECT_EQ(ref::Fp8ToDouble(0x01, F::kE4M3), std::ldexp(1.0, -9));   // smallest subnormal
  EXPECT_EQ(ref::Fp8ToDouble(0x01, F::kE5M2), std::ldexp(1.0, -16));
  EXPECT_EQ(ref::Fp8ToDouble(0x08, F::kE4M3), std::ldexp(1.0, -6));   // smallest normal
  EXPECT_EQ(ref::Fp8ToDouble(0xC0, F::kE4M3), -2.0);
  EXPECT_TRUE(std::isnan(ref::Fp8ToDouble(0x7F, F::kE4M3)));
  EXPECT_TRUE(std::isinf(ref::Fp8ToDouble(0x7C, F::kE5M2)));
  EXPECT_TRUE(std::isnan(ref::Fp8ToDouble(kFp8NaN, F::kE5M2)));
  EXPECT_EQ(ref::Fp8ToDouble(0x7E, F::kE4M3), Fp8Max(F::kE4M3));
  EXPECT_EQ(ref::Fp8ToDouble(0x7B, F::kE5M2), Fp8Max(F::kE5M2));
}

TEST(Fp8Ref, FiniteCodesRoundTripAndSaturate) {
  for (Fp8Format f : kFormats) {
    double prev = -1;
    for (int c = 0; c < 256; ++c) {
      const auto b = static_cast<uint8_t>(c);
      const double v = ref::Fp8ToDouble(b, f);
      if (!std::isfinite(v)) continue;
      if (c < 0x80) {
        EXPECT_GT(v, prev) << "codes increase, " << Fp8FormatName(f) << " code " << c;
        prev = v;
      }
      if (c == 0x80) continue;  // -0 keeps its sign, checked below
      EXPECT_EQ(ref::Fp8FromFloat(static_cast<float>(v), f), b) << Fp8FormatName(f) << " code " << c;
    }
    EXPECT_EQ(ref::Fp8FromFloat(-0.f, f), 0x80);
    const float max = Fp8Max(f);
    for (float big : {max * 1.01f, max * 1000, FLT_MAX, std::numeric_limits<float>::infinity()}) {
      EXPECT_EQ(ref::Fp8FromFloat(big, f), f == Fp8Format::kE4M3 ? 0x7E : 0x7B) << big;
      EXPECT_EQ(ref::Fp8FromFloat(-big, f), f == Fp8Format::kE4M3 ? 0xFE : 0xFB) << -big;
    }
  }
  // Ties go to the even code: 1 + 1/16 lies halfway between E4M3's 1 (0x38) and 1.125 (0x39).
  EXPECT_EQ(ref::Fp8FromFloat(1.0625f, Fp8Format::kE4M3), 0x38);
  EXPECT_EQ(ref::Fp8FromFloat(1.1875f, Fp8Format::kE4M3), 0x3A);  // between 0x39 and 0x3A: to 0x3A
}

TEST(Fp8Ref, MatchesToolkitConversionOnEveryBf16Value) {
  for (Fp8Format f : kFormats) {
    for (float scale : {1.f, 3.f, 0.001f, 1e6f}) {
      for (uint32_t bits = 0; bits < 65536; ++bits) {
        const float x = Bf16ToFloat(static_cast<uint16_t>(bits));
        const float v = x * scale;
        const uint8_t want = Toolkit(v, f), got = ref::Fp8FromFloat(v, f);
        if (std::isnan(v)) {
          ASSERT_TRUE(IsNaNCode(got, f) && IsNaNCode(want, f)) << "NaN";
          continue;
        }
        ASSERT_EQ(got, want) << Fp8FormatName(f) << " v " << v << " (bf16 bits " << bits << ", scale " << scale << ")";
      }
    }
  }
}

TEST(Fp8Ref, MatchesToolkitConversionOnRandomFloats) {
  std::mt19937_64 rng(TestSeed());
  std::uniform_int_distribution<uint32_t> bits;
  for (Fp8Format f : kFormats) {
    for (int i = 0; i < 200000; ++i) {
      uint32_t u = bits(rng);
      // Exponents near the formats' ranges, where the rounding decisions are.
      u = (u & 0x807FFFFFu) | ((100u + (u >> 23) % 60u) << 23);
      float v;
      std::memcpy(&v, &u, 4);
      ASSERT_EQ(ref::Fp8FromFloat(v, f), Toolkit(v, f)) << Fp8FormatName(f) << " v " << v << SeedNote();
    }
  }
}

TEST(Fp8Ref, ScaleAndCast) {
  using F = Fp8Format;
  EXPECT_EQ(ref::Fp8Scale(0, F::kE4M3), 1.f);        // all zeros: scale 1, every output 0
  EXPECT_EQ(ref::Fp8Scale(2, F::kE4M3), 224.f);
  EXPECT_EQ(ref::Fp8Scale(1e-40f, F::kE5M2), FLT_MAX);  // would overflow: clamped
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {1.f, -2.f, 0.f, nan, inf, -inf, 0.5f};
  EXPECT_EQ(ref::AmaxFinite(x), 2.f);
  const auto out = ref::Fp8Cast(x, ref::Fp8Scale(2.f, F::kE4M3), F::kE4M3);
  const std::vector<uint8_t> want = {ref::Fp8FromFloat(224.f, F::kE4M3), 0xFE, 0x00, kFp8NaN, kFp8NaN, kFp8NaN,
                                     ref::Fp8FromFloat(112.f, F::kE4M3)};
  EXPECT_EQ(out, want);
  EXPECT_EQ(ref::AmaxFinite({nan, inf}), 0.f);
}

// The fused casts' values against the RMSNorm and SwiGLU references in double: within fp32 rounding.
TEST(Fp8Ref, FusedCastValuesMatchTheNormAndSwiGluReferences) {
  std::mt19937_64 rng(TestSeed());
  const int64_t rows = 5, n = 67;
  const std::vector<double> xd = Quantized(RandomNormal(rows * n, 0, 2, rng), DType::kF32),
                            wd = Quantized(RandomNormal(n, 1, 0.5, rng), DType::kF32);
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end());
  std::vector<double> y, rstd;
  ref::RmsNormForward(xd, wd, rows, n, 1e-5, &y, &rstd);
  const std::vector<double> mine = ref::RmsNormRstd(x, rows, n, 1e-5f);
  std::vector<float> rstd_f;
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_NEAR(mine[r], rstd[r], 1e-6 * rstd[r]) << r << SeedNote();
    rstd_f.push_back(static_cast<float>(rstd[r]));
  }
  const std::vector<float> got = ref::RmsNormValues(x, w, rstd_f, rows, n);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], y[i], 4e-7 * std::fabs(y[i]) + 1e-30) << i << SeedNote();

  const std::vector<double> gd = Quantized(RandomNormal(1000, 0, 4, rng), DType::kF32),
                            ud = Quantized(RandomNormal(1000, 0, 1, rng), DType::kF32);
  std::vector<double> want;
  ref::SwiGluForward(gd, ud, &want);
  const std::vector<float> sw = ref::SiluProduct(std::vector<float>(gd.begin(), gd.end()),
                                                 std::vector<float>(ud.begin(), ud.end()));
  for (size_t i = 0; i < sw.size(); ++i) EXPECT_NEAR(sw[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-30) << i << SeedNote();
}

}  // namespace
}  // namespace ftd::kernels
