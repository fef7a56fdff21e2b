// Plain C++ reference of kernels/fp8_cast.cu, written for clarity: the FP8 formats decoded value by
// value, the nearest value found by search. The GPU test compares the production launcher with it bit
// for bit (given the scale the kernel chose, which must also be the one computed here).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/fp8_cast.h"

namespace ftd::kernels::ref {

// The value of an FP8 byte (NaN for the NaN codes, +-Inf for E5M2's infinities).
double Fp8ToDouble(uint8_t b, Fp8Format f);

// v rounded to the nearest FP8 value (ties to the even code), saturated to +-Fp8Max (infinities
// included); NaN becomes a NaN code. The sign of a zero result is the sign of v.
uint8_t Fp8FromFloat(float v, Fp8Format f);

// max |x| over the finite values (0 when none), and the scale the kernel derives from it:
// min(Fp8Max / amax, FLT_MAX) in fp32, or 1 when amax is 0.
float AmaxFinite(const std::vector<float>& x);
float Fp8Scale(float amax, Fp8Format f);

// out[i] = Fp8FromFloat(x[i] * scale) with the product rounded to fp32; NaN and +-Inf give kFp8NaN.
std::vector<uint8_t> Fp8Cast(const std::vector<float>& x, float scale, Fp8Format f);

// The values the fused casts (RmsNormFp8, SwiGluFp8) cast, in fp32 as the kernels compute them:
// RMSNorm's rstd per row in double (1 / sqrt(mean(x^2) + eps); the kernel sums in another order);
// (x * rstd) * w with each product rounded to fp32, given the rstd the kernel used (then exact);
// silu(gate) * up = gate * (1 / (1 + exp(-gate))) * up in fp32 (the device's expf may differ from the
// host's by an ulp or two, so a cast of it is exact except next to a rounding boundary).
std::vector<double> RmsNormRstd(const std::vector<float>& x, int64_t rows, int64_t n, float eps);
std::vector<float> RmsNormValues(const std::vector<float>& x, const std::vector<float>& w,
                                 const std::vector<float>& rstd, int64_t rows, int64_t n);
std::vector<float> SiluProduct(const std::vector<float>& gate, const std::vector<float>& up);

}  // namespace ftd::kernels::ref
