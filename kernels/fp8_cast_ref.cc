#include "kernels/fp8_cast_ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

namespace ftd::kernels::ref {
namespace {

struct Layout {
  int exp_bits, man_bits, bias;
};
Layout LayoutOf(Fp8Format f) { return f == Fp8Format::kE4M3 ? Layout{4, 3, 7} : Layout{5, 2, 15}; }

// The largest finite code (sign clear): 0x7E for E4M3 (0x7F is its NaN), 0x7B for E5M2 (0x7C.. are
// Inf and NaN).
uint8_t MaxCode(Fp8Format f) { return f == Fp8Format::kE4M3 ? 0x7E : 0x7B; }

}  // namespace

double Fp8ToDouble(uint8_t b, Fp8Format f) {
  const Layout l = LayoutOf(f);
  const bool neg = (b & 0x80) != 0;
  const int mag = b & 0x7F;
  const int e = mag >> l.man_bits, m = mag & ((1 << l.man_bits) - 1);
  const int emax = (1 << l.exp_bits) - 1;
  double v;
  if (f == Fp8Format::kE4M3 && mag == 0x7F) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (f == Fp8Format::kE5M2 && e == emax) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(m, 1 - l.bias - l.man_bits);  // subnormal: m * 2^(1 - bias - man_bits)
  } else {
    v = std::ldexp(1.0 + std::ldexp(m, -l.man_bits), e - l.bias);
  }
  return neg ? -v : v;
}

uint8_t Fp8FromFloat(float v, Fp8Format f) {
  if (std::isnan(v)) return kFp8NaN;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(v));
  const uint8_t max = MaxCode(f);
  if (a >= Fp8ToDouble(max, f)) return sign | max;
  // Codes 0..max are the non-negative finite values in increasing order: find the last one <= a.
  uint8_t lo = 0;
  while (lo < max && Fp8ToDouble(static_cast<uint8_t>(lo + 1), f) <= a) ++lo;
  const double below = a - Fp8ToDouble(lo, f), above = Fp8ToDouble(static_cast<uint8_t>(lo + 1), f) - a;
  const uint8_t code = below < above ? lo : above < below ? static_cast<uint8_t>(lo + 1) : (lo % 2 == 0 ? lo : lo + 1);
  return sign | code;
}

float AmaxFinite(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) {
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  }
  return m;
}

float Fp8Scale(float amax, Fp8Format f) {
  if (amax == 0) return 1.f;
  return std::min(Fp8Max(f) / amax, FLT_MAX);  // fp32 division; an overflow to +Inf is clamped
}

std::vector<uint8_t> Fp8Cast(const std::vector<float>& x, float scale, Fp8Format f) {
  std::vector<uint8_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = std::isfinite(x[i]) ? Fp8FromFloat(x[i] * scale, f) : kFp8NaN;
  }
  return out;
}

std::vector<double> RmsNormRstd(const std::vector<float>& x, int64_t rows, int64_t n, float eps) {
  std::vector<double> rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
    rstd[r] = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  }
  return rstd;
}

std::vector<float> RmsNormValues(const std::vector<float>& x, const std::vector<float>& w,
                                 const std::vector<float>& rstd, int64_t rows, int64_t n) {
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const float xr = x[r * n + i] * rstd[r];  // rounded to fp32 here, as the kernel does
      y[r * n + i] = xr * w[i];
    }
  }
  return y;
}

std::vector<float> SiluProduct(const std::vector<float>& gate, const std::vector<float>& up) {
  std::vector<float> y(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const float g = gate[i], s = 1.f / (1.f + std::exp(-g));
    y[i] = g * s * up[i];
  }
  return y;
}

}  // namespace ftd::kernels::ref
