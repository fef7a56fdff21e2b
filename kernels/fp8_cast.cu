// FP8 cast with per-tensor current scaling, amax and cast fused in one cooperative launch.
//
//   x:         (n) dtype (bf16 or fp32), contiguous      (read twice: amax pass, cast pass)
//   amax:      (1) fp32                                   (=)  max |x| over the finite elements
//   scale_inv: (1) fp32                                   (=)  1 / scale
//   out:       (n) fp8 bytes, E4M3 or E5M2                (=)  fp8(x * scale), saturated, RNE
// scale = min(Fp8Max / amax, FLT_MAX) (IEEE division), or 1 when amax is 0 (all zeros, or no finite
// element). The cast multiplies in fp32 (x widened exactly) and converts with the hardware's
// round-to-nearest-even, saturating conversion (__NV_SATFINITE); NaN and +-Inf become kFp8NaN. Given
// the scale the result is exact: kernels/fp8_cast_ref.cc reproduces it bit for bit.
//
// One launch: every block computes the amax of its grid-stride share, the block maxima meet in `amax`
// (atomicMax on the fp32 bits: every value is >= 0, where the integer order is the float order), the
// grid synchronises (cooperative launch, all blocks resident), then every block reads the amax, derives
// the scale and casts its share; block 0 writes scale_inv. The second read of x is served from L2 for
// tensors that fit it (the H200 has 50 MB).
//
// Paths: vector when x is 16-byte aligned and out aligned to the vector's bytes (8 bf16 / 4 fp32
// elements a 16-byte load, 8 / 4 bytes a store), the n % V tail element by element; scalar otherwise.
#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/common.cuh"
#include "kernels/fp8_cast.h"

namespace ftd::kernels {
namespace {

using namespace detail;  // the device helpers of common.cuh

constexpr int kThreads = 512;

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

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    Fp8CastAmaxKernel(const T* __restrict__ x, int64_t n, bool vec, uint8_t* __restrict__ out, float* amax,
                      float* scale_inv) {
  constexpr int V = kVec<T>;
  __shared__ float scratch[32];
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t nvec = vec ? n / V : 0;

  float m = 0.f;
  for (int64_t i = tid; i < nvec; i += stride) {
    const Vec<T> v = LoadVec(x + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) m = AbsMaxFinite(m, ToFloat(v.v[j]));
  }
  for (int64_t e = nvec * V + tid; e < n; e += stride) m = AbsMaxFinite(m, ToFloat(x[e]));
  m = BlockMax(m, scratch);
  if (threadIdx.x == 0 && m > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));

  cooperative_groups::this_grid().sync();  // every block's maximum is in amax, and visible

  const float a = __ldcg(amax);
  const float scale = a > 0.f ? fminf(__fdiv_rn(Fp8Max(F), a), FLT_MAX) : 1.f;
  if (tid == 0) *scale_inv = __fdiv_rn(1.f, scale);
  for (int64_t i = tid; i < nvec; i += stride) {
    const Vec<T> v = LoadVec(x + i * V);
    Bytes<V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.b[j] = ToFp8<F>(__fmul_rn(ToFloat(v.v[j]), scale));
    *reinterpret_cast<Bytes<V>*>(out + i * V) = o;
  }
  for (int64_t e = nvec * V + tid; e < n; e += stride) out[e] = ToFp8<F>(__fmul_rn(ToFloat(x[e]), scale));
}

template <typename T, Fp8Format F>
cudaError_t Launch(const DeviceProps& props, const T* x, int64_t n, uint8_t* out, float* amax, float* scale_inv,
                   cudaStream_t stream) {
  constexpr int V = kVec<T>;
  bool vec = Aligned16(x) && (reinterpret_cast<uintptr_t>(out) % V) == 0;
  const auto kernel = Fp8CastAmaxKernel<T, F>;
  const int64_t work = vec ? std::max<int64_t>(n / V, n % V) : n;
  const int64_t blocks = std::clamp<int64_t>(CeilDiv(work, kThreads), 1,
                                             ResidentBlocks(props, reinterpret_cast<const void*>(kernel), kThreads));
  if (const cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), stream); e != cudaSuccess) return e;
  void* args[] = {&x, &n, &vec, &out, &amax, &scale_inv};
  return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(static_cast<unsigned>(blocks)),
                                     dim3(kThreads), args, 0, stream);
}

template <typename T>
cudaError_t Dispatch(const DeviceProps& props, Fp8Format format, const void* x, int64_t n, uint8_t* out, float* amax,
                     float* scale_inv, cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  return format == Fp8Format::kE4M3 ? Launch<T, Fp8Format::kE4M3>(props, xt, n, out, amax, scale_inv, stream)
                                    : Launch<T, Fp8Format::kE5M2>(props, xt, n, out, amax, scale_inv, stream);
}

}  // namespace

cudaError_t Fp8CastAmax(const DeviceProps& props, DType dtype, Fp8Format format, const void* x, int64_t n,
                        uint8_t* out, float* amax, float* scale_inv, cudaStream_t stream) {
  if (n < 0 || amax == nullptr || scale_inv == nullptr) return cudaErrorInvalidValue;
  if (n > 0 && (x == nullptr || out == nullptr)) return cudaErrorInvalidValue;
  return dtype == DType::kF32 ? Dispatch<float>(props, format, x, n, out, amax, scale_inv, stream)
                              : Dispatch<__nv_bfloat16>(props, format, x, n, out, amax, scale_inv, stream);
}

}  // namespace ftd::kernels
