// Device helpers shared by the FP8 cast families (fp8_cast.cu, fp8_tiles.cu): the saturating
// conversion, the finite amax, the scale an amax gives and the grid-wide amax of a cooperative launch.
// Included by .cu files only.
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/fp8_cast.h"

namespace ftd::kernels::detail {

// fp8(v) rounded to nearest even and saturated to +-Fp8Max(F); NaN and +-Inf become kFp8NaN.
template <Fp8Format F>
__device__ __forceinline__ uint8_t ToFp8(float v) {
  if (!isfinite(v)) return kFp8NaN;
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

__device__ __forceinline__ float AbsMaxFinite(float m, float v) { return isfinite(v) ? fmaxf(m, fabsf(v)) : m; }

// Bytes of V fp8 values, stored in one instruction.
template <int V>
struct alignas(V) Bytes {
  uint8_t b[V];
};

// The scale an amax gives: min(Fp8Max / amax, FLT_MAX) (IEEE division), or 1 when amax is 0.
template <Fp8Format F>
__device__ __forceinline__ float ScaleOf(float a) {
  return a > 0.f ? fminf(__fdiv_rn(Fp8Max(F), a), FLT_MAX) : 1.f;
}

// The scale the amax at `amax` gives, and block 0's thread 0 writes its inverse.
template <Fp8Format F>
__device__ __forceinline__ float ScaleFrom(const float* amax, float* scale_inv) {
  const float scale = ScaleOf<F>(__ldcg(amax));
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.f, scale);
  return scale;
}

// The block's maximum into amax (atomicMax on the fp32 bits: every value is >= 0), then the grid sync
// after which amax holds every block's maximum, visible to all. amax must be zero before the launch.
__device__ __forceinline__ void GridAmax(float m, float* scratch, float* amax) {
  m = BlockMax(m, scratch);
  if (threadIdx.x == 0 && m > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
  cooperative_groups::this_grid().sync();
}

}  // namespace ftd::kernels::detail
