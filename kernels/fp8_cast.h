// FP8 casts with per-tensor current scaling: one launch computes a tensor's amax and casts it to FP8
// E4M3 or E5M2 with the scale that amax gives. Contract, precision and the tail/alignment rules are at
// the top of kernels/fp8_cast.cu; the CPU reference is kernels/fp8_cast_ref.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common.h"
#include "kernels/launch_plan.h"

namespace ftd::kernels {

// The two FP8 formats of sm_89+ tensor cores (OCP FP8): E4M3 (largest finite 448, no infinity; used for
// activations and weights) and E5M2 (largest finite 57344; more range, for gradients).
enum class Fp8Format { kE4M3, kE5M2 };

inline constexpr float Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? 448.f : 57344.f; }
inline const char* Fp8FormatName(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

// The byte a NaN or infinite input becomes (a quiet NaN in both formats), so a non-finite value is never
// made finite by the cast: the trainer's finite check then stops the update.
inline constexpr uint8_t kFp8NaN = 0x7F;

// x: n elements of `dtype` (kBF16 or kF32), contiguous.
// amax (=): max |x| over the finite elements (0 when there are none); one fp32 on the device.
// scale_inv (=): 1 / scale, the dequantization factor (x ~ fp8 value * scale_inv), one fp32 on the
//   device, where scale = min(Fp8Max(format) / amax, FLT_MAX), or 1 when amax is 0.
// out (=): n bytes, out[i] = fp8(x[i] * scale) rounded to nearest even and saturated to
//   +-Fp8Max(format); NaN and +-Inf inputs become kFp8NaN.
// props: the current device's (QueryDeviceProps); the launch is cooperative (every block resident), so
// no other cooperative kernel may need the whole device at the same time. n >= 0; out must not overlap x.
cudaError_t Fp8CastAmax(const DeviceProps& props, DType dtype, Fp8Format format, const void* x, int64_t n,
                        uint8_t* out, float* amax, float* scale_inv, cudaStream_t stream);

// The casts fused into the producers of the fp8 set's GEMM inputs (the value is never stored in bf16):
// the same amax, scale_inv and out contract as Fp8CastAmax, over the producer's fp32 value.
//
// SwiGluFp8: value = silu(gate) * up (as kernels/swiglu.h computes it), n elements of `dtype` each.
cudaError_t SwiGluFp8(const DeviceProps& props, DType dtype, Fp8Format format, const void* gate, const void* up,
                      int64_t n, uint8_t* out, float* amax, float* scale_inv, cudaStream_t stream);

// RmsNormFp8: x [rows, n] row-major and w [n] of `dtype`; value = (x * rstd) * w, each product rounded to
// fp32, with rstd (=) [rows] fp32 = rsqrtf(mean(x^2) + eps) per row (what RmsNormBackward takes). out:
// rows * n bytes. rows >= 0, 1 <= n < 2^31.
cudaError_t RmsNormFp8(const DeviceProps& props, DType dtype, Fp8Format format, const void* x, const void* w,
                       int64_t rows, int64_t n, float eps, float* rstd, uint8_t* out, float* amax, float* scale_inv,
                       cudaStream_t stream);

}  // namespace ftd::kernels
