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

}  // namespace ftd::kernels::ref
