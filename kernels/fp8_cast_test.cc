// GPU test of the production FP8 cast+amax launcher against the reference (kernels/fp8_cast_ref.h):
// the amax and the scale exactly, and every output byte exactly given that scale. Fresh random inputs
// every run; the output is poisoned with 0xFF (a negative NaN code, which the kernel never writes)
// before each launch.
//
// Cases: fp32 and bf16 inputs, E4M3 and E5M2, sizes below one vector, at vector multiples and odd
// (4097, 8003, 14336 * 37 + 5: many blocks and a tail), unaligned views (scalar path), all zeros,
// NaN and +-Inf among finite values, values that underflow to subnormals and zero, an amax whose scale
// overflows fp32 (clamped), and elements equal to +-amax (the largest code, saturated when x * scale
// rounds above the format's maximum).
#include "kernels/fp8_cast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/fp8_cast_ref.h"
#include "kernels/test_util.h"

namespace ftd::kernels {
namespace {

using namespace testing;  // kernels/test_util.h

enum class Fill { kNormal, kZeros, kSpecials, kWide, kTiny };

struct Case {
  int64_t n;
  size_t offset = 0;  // elements into the allocation: 1 makes x and out unaligned
  Fill fill = Fill::kNormal;
};

const char* FillName(Fill f) {
  switch (f) {
    case Fill::kNormal: return "normal";
    case Fill::kZeros: return "zeros";
    case Fill::kSpecials: return "nan/inf";
    case Fill::kWide: return "wide";
    case Fill::kTiny: return "tiny";
  }
  return "?";
}

std::string Name(const Case& c, DType t, Fp8Format f) {
  return std::string(DTypeName(t)) + "->" + Fp8FormatName(f) + " n " + std::to_string(c.n) +
         (c.offset ? " unaligned " : " ") + FillName(c.fill) + SeedNote();
}

std::vector<double> Inputs(const Case& c, DType t) {
  std::mt19937_64 rng(TestSeed() + static_cast<uint64_t>(c.n) * 7 + static_cast<uint64_t>(c.fill));
  const size_t n = static_cast<size_t>(c.n);
  std::vector<double> x = RandomNormal(n, 0, 3, rng);
  const double inf = std::numeric_limits<double>::infinity();
  switch (c.fill) {
    case Fill::kNormal:
      if (n >= 4) {  // +-amax: the largest code, at the saturation boundary
        x[0] = 20.0;
        x[n - 1] = -20.0;
      }
      break;
    case Fill::kZeros:
      for (auto& v : x) v = 0;
      break;
    case Fill::kSpecials:
      for (size_t i = 0; i < n; i += 97) x[i] = std::numeric_limits<double>::quiet_NaN();
      for (size_t i = 13; i < n; i += 101) x[i] = inf;
      for (size_t i = 29; i < n; i += 103) x[i] = -inf;
      break;
    case Fill::kWide: {  // magnitudes 2^-40 .. 2^20: most small ones become subnormals or zero
      std::uniform_real_distribution<double> e(-40, 20);
      for (auto& v : x) v = std::copysign(std::exp2(e(rng)), v);
      break;
    }
    case Fill::kTiny:  // amax far below 1: 448 / amax overflows fp32 for fp32 inputs
      for (auto& v : x) v *= t == DType::kF32 ? 1e-41 : 1e-30;
      break;
  }
  return Quantized(x, t);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int64_t n : {1, 7, 8, 9, 4097, 8003, 3 * 14336, 37 * 14336 + 5}) cases.push_back({n});
  for (int64_t n : {4097, 8192}) cases.push_back({n, 1});
  for (Fill f : {Fill::kZeros, Fill::kSpecials, Fill::kWide, Fill::kTiny}) {
    cases.push_back({8003, 0, f});
    cases.push_back({8003, 1, f});
  }
  cases.push_back({5, 0, Fill::kSpecials});
  return cases;
}

// n bytes on the device, `offset` bytes into the allocation.
class Bytes {
 public:
  Bytes(size_t n, size_t offset) : buf_(CeilDiv(static_cast<int64_t>(n + offset), 4), DType::kF32), off_(offset), n_(n) {}
  uint8_t* get() const { return static_cast<uint8_t*>(buf_.get()) + off_; }
  void Poison() { buf_.Poison(); }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> h(n_);
    if (n_ > 0) Check(cudaMemcpy(h.data(), get(), n_, cudaMemcpyDeviceToHost), "download bytes");
    return h;
  }

 private:
  DeviceBuffer buf_;
  size_t off_, n_;
};

float DownloadScalar(const DeviceBuffer& b) {
  float v;
  Check(cudaMemcpy(&v, b.get(), 4, cudaMemcpyDeviceToHost), "download scalar");
  return v;
}

void RunCase(const DeviceProps& props, const Case& c, DType t, Fp8Format f) {
  const std::vector<double> xd = Inputs(c, t);
  const std::vector<float> xf(xd.begin(), xd.end());
  const size_t n = static_cast<size_t>(c.n);
  Tensor x(n, t, c.offset);
  x.Upload(xd);
  Bytes out(n, c.offset);
  out.Poison();
  DeviceBuffer amax(1, DType::kF32), scale_inv(1, DType::kF32);
  amax.Poison();
  scale_inv.Poison();
  ASSERT_EQ(cudaSuccess, Fp8CastAmax(props, t, f, x.get(), c.n, out.get(), amax.as<float>(), scale_inv.as<float>(),
                                     nullptr))
      << Name(c, t, f);
  Check(cudaDeviceSynchronize(), "Fp8CastAmax");
  const float want_amax = ref::AmaxFinite(xf), scale = ref::Fp8Scale(want_amax, f);
  ASSERT_EQ(DownloadScalar(amax), want_amax) << "amax, " << Name(c, t, f);
  ASSERT_EQ(DownloadScalar(scale_inv), 1.f / scale) << "scale_inv, " << Name(c, t, f);
  const std::vector<uint8_t> got = out.Download(), want = ref::Fp8Cast(xf, scale, f);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i] && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "first at " << first << ": x " << xf[first] << " got " << int{got[first]} << " want "
                     << int{want[first]} << ", " << Name(c, t, f);
  if (c.fill == Fill::kNormal && n >= 4) {
    const uint8_t max = f == Fp8Format::kE4M3 ? 0x7E : 0x7B;
    EXPECT_EQ(got[0], max) << "+amax, " << Name(c, t, f);
    EXPECT_EQ(got[n - 1], max | 0x80) << "-amax, " << Name(c, t, f);
  }
}

TEST(Fp8CastGpu, MatchesReferenceExactly) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      for (const Case& c : Cases()) RunCase(props, c, t, f);
    }
  }
}

// Bytes that differ from the reference's: none, except (allow_boundary) where got and want are adjacent
// codes and the value lies within 1e-5 relative of the midpoint between them (the device's expf may
// differ from the host's by an ulp or two; a value next to a rounding boundary may then round either way).
size_t Mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::vector<float>& v,
                  float scale, Fp8Format f, bool allow_boundary, std::string* first) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (allow_boundary && (got[i] & 0x80) == (want[i] & 0x80) && std::abs(int{got[i]} - int{want[i]}) == 1) {
      const double mid = (ref::Fp8ToDouble(got[i], f) + ref::Fp8ToDouble(want[i], f)) / 2;
      if (std::fabs(static_cast<double>(v[i]) * scale - mid) <= 1e-5 * std::fabs(mid)) continue;
    }
    if (bad++ == 0) {
      *first = "first at " + std::to_string(i) + ": value " + std::to_string(v[i]) + " got " + std::to_string(got[i]) +
               " want " + std::to_string(want[i]);
    }
  }
  return bad;
}

// Rows of the norm's and SwiGLU's inputs: normal values, all zeros, or NaN and +-Inf in some rows.
std::vector<double> FusedInputs(int64_t rows, int64_t n, Fill fill, DType t, double stddev, uint64_t salt) {
  std::mt19937_64 rng(TestSeed() + static_cast<uint64_t>(rows * n) * 7 + salt);
  std::vector<double> x = RandomNormal(static_cast<size_t>(rows * n), 0, stddev, rng);
  if (fill == Fill::kZeros) std::fill(x.begin(), x.end(), 0.0);
  if (fill == Fill::kSpecials && rows * n >= 3) {
    x[0] = std::numeric_limits<double>::quiet_NaN();
    x[static_cast<size_t>(rows * n) / 2] = std::numeric_limits<double>::infinity();
    x[static_cast<size_t>(rows * n) - 1] = -std::numeric_limits<double>::infinity();
  }
  return Quantized(x, t);
}

struct FusedCase {
  int64_t rows, n;
  size_t offset = 0;  // 1: unaligned inputs and output (scalar path)
  Fill fill = Fill::kNormal;
};

std::vector<FusedCase> FusedCases() {
  std::vector<FusedCase> cases = {{1, 1}, {3, 7}, {5, 8}, {17, 4097}, {64, 4096}, {64, 4096, 1}, {1024, 4096},
                                  {37, 14336}, {2, 4096, 0, Fill::kZeros}};
  for (size_t off : {0, 1}) cases.push_back({9, 4096, off, Fill::kSpecials});
  return cases;
}

std::string FusedName(const char* op, const FusedCase& c, DType t, Fp8Format f) {
  return std::string(op) + " " + DTypeName(t) + "->" + Fp8FormatName(f) + " " + std::to_string(c.rows) + "x" +
         std::to_string(c.n) + (c.offset ? " unaligned " : " ") + FillName(c.fill) + SeedNote();
}

std::vector<float> Floats(const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); }

// RMSNorm with the cast fused: the rstd against the double reference, then given the kernel's rstd the
// amax, the scale and every byte exactly; a row holding NaN or Inf keeps them non-finite.
TEST(Fp8CastGpu, RmsNormFp8MatchesReferenceExactlyGivenItsRstd) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  const float eps = 1e-5f;
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      for (const FusedCase& c : FusedCases()) {
        const std::string name = FusedName("rmsnorm", c, t, f);
        const size_t total = static_cast<size_t>(c.rows * c.n);
        const std::vector<double> xd = FusedInputs(c.rows, c.n, c.fill, t, 3, 1),
                                  wd = FusedInputs(1, c.n, Fill::kNormal, t, 1, 2);
        Tensor x(total, t, c.offset), w(static_cast<size_t>(c.n), t, c.offset);
        x.Upload(xd);
        w.Upload(wd);
        Bytes out(total, c.offset);
        out.Poison();
        DeviceBuffer rstd(static_cast<size_t>(c.rows), DType::kF32), amax(1, DType::kF32), scale_inv(1, DType::kF32);
        rstd.Poison();
        scale_inv.Poison();
        ASSERT_EQ(cudaSuccess, RmsNormFp8(props, t, f, x.get(), w.get(), c.rows, c.n, eps, rstd.as<float>(),
                                          out.get(), amax.as<float>(), scale_inv.as<float>(), nullptr))
            << name;
        Check(cudaDeviceSynchronize(), "RmsNormFp8");
        const std::vector<double> got_rstd = rstd.Download();
        const std::vector<double> want_rstd = ref::RmsNormRstd(Floats(xd), c.rows, c.n, eps);
        for (int64_t r = 0; r < c.rows; ++r) {
          if (std::isfinite(want_rstd[r])) {
            ASSERT_NEAR(got_rstd[r], want_rstd[r], 1e-5 * want_rstd[r]) << "rstd row " << r << ", " << name;
          } else {
            ASSERT_TRUE(std::isnan(got_rstd[r])) << "rstd row " << r << " " << got_rstd[r] << ", " << name;
          }
        }
        const std::vector<float> v = ref::RmsNormValues(Floats(xd), Floats(wd), Floats(got_rstd), c.rows, c.n);
        const float want_amax = ref::AmaxFinite(v), scale = ref::Fp8Scale(want_amax, f);
        ASSERT_EQ(DownloadScalar(amax), want_amax) << "amax, " << name;
        ASSERT_EQ(DownloadScalar(scale_inv), 1.f / scale) << "scale_inv, " << name;
        const std::vector<uint8_t> got = out.Download(), want = ref::Fp8Cast(v, scale, f);
        std::string first;
        EXPECT_EQ(Mismatches(got, want, v, scale, f, false, &first), 0u) << first << ", " << name;
        if (c.fill == Fill::kSpecials) {
          EXPECT_EQ(got[0], kFp8NaN) << "NaN input, " << name;
          EXPECT_EQ(got[total / 2], kFp8NaN) << "Inf input, " << name;
        }
      }
    }
  }
}

// SwiGLU with the cast fused: the amax within the expf difference, the scale from the kernel's amax
// exactly, every byte exactly but for values next to a rounding boundary; NaN/Inf inputs give NaN.
TEST(Fp8CastGpu, SwiGluFp8MatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      for (const FusedCase& c : FusedCases()) {
        const std::string name = FusedName("swiglu", c, t, f);
        const size_t total = static_cast<size_t>(c.rows * c.n);
        const std::vector<double> gd = FusedInputs(c.rows, c.n, c.fill, t, 4, 3),
                                  ud = FusedInputs(c.rows, c.n, Fill::kNormal, t, 1, 4);
        Tensor gate(total, t, c.offset), up(total, t, c.offset);
        gate.Upload(gd);
        up.Upload(ud);
        Bytes out(total, c.offset);
        out.Poison();
        DeviceBuffer amax(1, DType::kF32), scale_inv(1, DType::kF32);
        scale_inv.Poison();
        ASSERT_EQ(cudaSuccess, SwiGluFp8(props, t, f, gate.get(), up.get(), static_cast<int64_t>(total), out.get(),
                                         amax.as<float>(), scale_inv.as<float>(), nullptr))
            << name;
        Check(cudaDeviceSynchronize(), "SwiGluFp8");
        const std::vector<float> v = ref::SiluProduct(Floats(gd), Floats(ud));
        const float got_amax = DownloadScalar(amax), want_amax = ref::AmaxFinite(v);
        ASSERT_NEAR(got_amax, want_amax, 1e-6 * want_amax) << "amax, " << name;
        const float scale = ref::Fp8Scale(got_amax, f);
        ASSERT_EQ(DownloadScalar(scale_inv), 1.f / scale) << "scale_inv, " << name;
        const std::vector<uint8_t> got = out.Download(), want = ref::Fp8Cast(v, scale, f);
        std::string first;
        EXPECT_EQ(Mismatches(got, want, v, scale, f, true, &first), 0u) << first << ", " << name;
        if (c.fill == Fill::kSpecials) {
          EXPECT_EQ(got[0], kFp8NaN) << "NaN gate, " << name;
          EXPECT_EQ(got[total - 1], kFp8NaN) << "-Inf gate (-inf * 0), " << name;
        }
      }
    }
  }
}

TEST(Fp8CastGpu, EmptyAndInvalid) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const DeviceProps props = CurrentProps();
  DeviceBuffer amax(1, DType::kF32), scale_inv(1, DType::kF32), x(8, DType::kBF16);
  amax.Poison();
  scale_inv.Poison();
  ASSERT_EQ(cudaSuccess, Fp8CastAmax(props, DType::kBF16, Fp8Format::kE4M3, nullptr, 0, nullptr, amax.as<float>(),
                                     scale_inv.as<float>(), nullptr));
  Check(cudaDeviceSynchronize(), "empty");
  EXPECT_EQ(DownloadScalar(amax), 0.f);
  EXPECT_EQ(DownloadScalar(scale_inv), 1.f);
  EXPECT_EQ(cudaErrorInvalidValue, Fp8CastAmax(props, DType::kBF16, Fp8Format::kE4M3, x.get(), -1, x.as<uint8_t>(),
                                               amax.as<float>(), scale_inv.as<float>(), nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, Fp8CastAmax(props, DType::kBF16, Fp8Format::kE4M3, x.get(), 8, nullptr,
                                               amax.as<float>(), scale_inv.as<float>(), nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, Fp8CastAmax(props, DType::kBF16, Fp8Format::kE4M3, x.get(), 8, x.as<uint8_t>(),
                                               nullptr, scale_inv.as<float>(), nullptr));
  float* rstd = amax.as<float>();
  EXPECT_EQ(cudaErrorInvalidValue, RmsNormFp8(props, DType::kBF16, Fp8Format::kE4M3, x.get(), x.get(), 1, 0, 1e-5f,
                                              rstd, x.as<uint8_t>(), amax.as<float>(), scale_inv.as<float>(), nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, RmsNormFp8(props, DType::kBF16, Fp8Format::kE4M3, x.get(), x.get(), 2, 4, 1e-5f,
                                              nullptr, x.as<uint8_t>(), amax.as<float>(), scale_inv.as<float>(), nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, SwiGluFp8(props, DType::kBF16, Fp8Format::kE4M3, x.get(), nullptr, 8,
                                             x.as<uint8_t>(), amax.as<float>(), scale_inv.as<float>(), nullptr));
  ASSERT_EQ(cudaSuccess, SwiGluFp8(props, DType::kBF16, Fp8Format::kE4M3, nullptr, nullptr, 0, nullptr,
                                   amax.as<float>(), scale_inv.as<float>(), nullptr));
  ASSERT_EQ(cudaSuccess, RmsNormFp8(props, DType::kBF16, Fp8Format::kE4M3, nullptr, nullptr, 0, 4096, 1e-5f, nullptr,
                                    nullptr, amax.as<float>(), scale_inv.as<float>(), nullptr));
  Check(cudaDeviceSynchronize(), "empty fused");
  EXPECT_EQ(DownloadScalar(amax), 0.f);
  EXPECT_EQ(DownloadScalar(scale_inv), 1.f);
}

}  // namespace
}  // namespace ftd::kernels
