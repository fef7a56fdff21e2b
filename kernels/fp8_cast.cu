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
//
// The casts fused into the producers of the fp8 set's GEMM inputs follow the same two-pass scheme in one
// launch, computing the producer's value in both passes instead of reading a bf16 copy of it:
//   SwiGluFp8:  the value is silu(gate) * up (swiglu.cu's arithmetic: expf and IEEE division); elementwise
//               as above (vector path when gate and up are both 16-byte aligned). Reads gate and up
//               twice, writes 1 byte an element: 9 bytes against 11 for SwiGLU in bf16 then the cast.
//   RmsNormFp8: the value is (x * rstd) * w, each product rounded to fp32, rstd = rsqrtf(mean(x^2) + eps)
//               (rmsnorm.cu's formula) written per row for the norm's backward. One warp per row (rows
//               grid-strided): the sum of squares, then the row's amax (the row's second read comes
//               from L1/L2); after the grid sync each warp reads its rows' rstd back and casts. Vector
//               path when n % V == 0 and x, w are 16-byte aligned and out V-byte aligned. Reads x twice,
//               writes 1 byte an element: 5 bytes against 9 for the norm in bf16 then the cast.
// Current scaling needs the whole tensor's amax before the first byte is written, hence the second
// read; delayed scaling (a previous step's amax) would save it at the price of possible saturation
// when the amax grows, and is not used.
#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/common.cuh"
#include "kernels/fp8_cast.h"
#include "kernels/fp8_common.cuh"

namespace ftd::kernels {
namespace {

using namespace detail;  // the device helpers of common.cuh and fp8_common.cuh

constexpr int kThreads = 512;

// Sources of the elementwise cast: element e of the tensor being cast, and vector i (elements
// [i * V, i * V + V)) on the vector path, in fp32.
template <typename T>
struct Plain {
  static constexpr int V = kVec<T>;
  const T* x;
  bool Aligned() const { return Aligned16(x); }
  __device__ __forceinline__ void Vector(int64_t i, float (&f)[V]) const {
    const Vec<T> v = LoadVec(x + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = ToFloat(v.v[j]);
  }
  __device__ __forceinline__ float At(int64_t e) const { return ToFloat(x[e]); }
};

__device__ __forceinline__ float SiluMul(float g, float u) { return g * (1.f / (1.f + expf(-g))) * u; }  // swiglu.cu

template <typename T>
struct SiluProduct {
  static constexpr int V = kVec<T>;
  const T* gate;
  const T* up;
  bool Aligned() const { return Aligned16(gate) && Aligned16(up); }
  __device__ __forceinline__ void Vector(int64_t i, float (&f)[V]) const {
    const Vec<T> g = LoadVec(gate + i * V), u = LoadVec(up + i * V);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = SiluMul(ToFloat(g.v[j]), ToFloat(u.v[j]));
  }
  __device__ __forceinline__ float At(int64_t e) const { return SiluMul(ToFloat(gate[e]), ToFloat(up[e])); }
};

template <typename Src, Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    Fp8CastAmaxKernel(Src src, int64_t n, bool vec, uint8_t* __restrict__ out, float* amax, float* scale_inv) {
  constexpr int V = Src::V;
  __shared__ float scratch[32];
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t nvec = vec ? n / V : 0;
  float f[V];

  float m = 0.f;
  for (int64_t i = tid; i < nvec; i += stride) {
    src.Vector(i, f);
#pragma unroll
    for (int j = 0; j < V; ++j) m = AbsMaxFinite(m, f[j]);
  }
  for (int64_t e = nvec * V + tid; e < n; e += stride) m = AbsMaxFinite(m, src.At(e));
  GridAmax(m, scratch, amax);

  const float scale = ScaleFrom<F>(amax, scale_inv);
  for (int64_t i = tid; i < nvec; i += stride) {
    src.Vector(i, f);
    Bytes<V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.b[j] = ToFp8<F>(__fmul_rn(f[j], scale));
    *reinterpret_cast<Bytes<V>*>(out + i * V) = o;
  }
  for (int64_t e = nvec * V + tid; e < n; e += stride) out[e] = ToFp8<F>(__fmul_rn(src.At(e), scale));
}

// Launches `kernel` cooperatively with `threads` a block and at most `work` blocks' worth of threads,
// after zeroing amax.
template <typename... Args>
cudaError_t LaunchCooperative(const DeviceProps& props, const void* kernel, int64_t work, float* amax,
                              cudaStream_t stream, Args... args) {
  const int64_t blocks = std::clamp<int64_t>(CeilDiv(work, kThreads), 1, ResidentBlocks(props, kernel, kThreads));
  if (const cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), stream); e != cudaSuccess) return e;
  void* ptrs[] = {&args...};
  return cudaLaunchCooperativeKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), ptrs, 0, stream);
}

template <typename Src, Fp8Format F>
cudaError_t LaunchElementwise(const DeviceProps& props, Src src, int64_t n, uint8_t* out, float* amax,
                              float* scale_inv, cudaStream_t stream) {
  constexpr int V = Src::V;
  const bool vec = src.Aligned() && (reinterpret_cast<uintptr_t>(out) % V) == 0;
  const int64_t work = vec ? std::max<int64_t>(n / V, n % V) : n;
  return LaunchCooperative(props, reinterpret_cast<const void*>(Fp8CastAmaxKernel<Src, F>), work, amax, stream, src,
                           n, vec, out, amax, scale_inv);
}

template <template <typename> class Src, typename... Ptrs>
cudaError_t DispatchElementwise(const DeviceProps& props, DType dtype, Fp8Format format, int64_t n, uint8_t* out,
                                float* amax, float* scale_inv, cudaStream_t stream, Ptrs... ptrs) {
  using K = Fp8Format;
  if (dtype == DType::kF32) {
    const Src<float> s{static_cast<const float*>(ptrs)...};
    return format == K::kE4M3 ? LaunchElementwise<Src<float>, K::kE4M3>(props, s, n, out, amax, scale_inv, stream)
                              : LaunchElementwise<Src<float>, K::kE5M2>(props, s, n, out, amax, scale_inv, stream);
  }
  const Src<__nv_bfloat16> s{static_cast<const __nv_bfloat16*>(ptrs)...};
  return format == K::kE4M3
             ? LaunchElementwise<Src<__nv_bfloat16>, K::kE4M3>(props, s, n, out, amax, scale_inv, stream)
             : LaunchElementwise<Src<__nv_bfloat16>, K::kE5M2>(props, s, n, out, amax, scale_inv, stream);
}

// W elements of a row from p (one 16-byte vector when W == kVec<T>, else W == 1), in fp32.
template <typename T, int W>
__device__ __forceinline__ void LoadRow(const T* p, float (&f)[W]) {
  if constexpr (W == 1) {
    f[0] = ToFloat(*p);
  } else {
    const Vec<T> v = LoadVec(p);
#pragma unroll
    for (int j = 0; j < W; ++j) f[j] = ToFloat(v.v[j]);
  }
}

__device__ __forceinline__ float NormValue(float x, float r, float w) { return __fmul_rn(__fmul_rn(x, r), w); }

template <typename T, Fp8Format F, int W>
__global__ void __launch_bounds__(kThreads)
    RmsNormFp8Kernel(const T* __restrict__ x, const T* __restrict__ w, int64_t rows, int n, float eps, float* rstd,
                     uint8_t* __restrict__ out, float* amax, float* scale_inv) {
  __shared__ float scratch[32];
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * kThreads) >> 5;
  const int nc = n / W;
  float xf[W], wf[W];

  float m = 0.f;
  for (int64_t row = warp; row < rows; row += warps) {
    const T* xr = x + row * n;
    float ss = 0.f;
    for (int c = lane; c < nc; c += 32) {
      LoadRow<T, W>(xr + static_cast<int64_t>(c) * W, xf);
#pragma unroll
      for (int j = 0; j < W; ++j) ss += xf[j] * xf[j];
    }
    ss = WarpSum(ss);
    const float r = rsqrtf(ss / static_cast<float>(n) + eps);
    if (lane == 0) rstd[row] = r;
    for (int c = lane; c < nc; c += 32) {
      LoadRow<T, W>(xr + static_cast<int64_t>(c) * W, xf);
      LoadRow<T, W>(w + static_cast<int64_t>(c) * W, wf);
#pragma unroll
      for (int j = 0; j < W; ++j) m = AbsMaxFinite(m, NormValue(xf[j], r, wf[j]));
    }
  }
  GridAmax(m, scratch, amax);  // the grid sync also makes every row's rstd visible

  const float scale = ScaleFrom<F>(amax, scale_inv);
  for (int64_t row = warp; row < rows; row += warps) {
    const T* xr = x + row * n;
    uint8_t* outr = out + row * n;
    const float r = __ldcg(rstd + row);
    for (int c = lane; c < nc; c += 32) {
      LoadRow<T, W>(xr + static_cast<int64_t>(c) * W, xf);
      LoadRow<T, W>(w + static_cast<int64_t>(c) * W, wf);
      Bytes<W> o;
#pragma unroll
      for (int j = 0; j < W; ++j) o.b[j] = ToFp8<F>(__fmul_rn(NormValue(xf[j], r, wf[j]), scale));
      *reinterpret_cast<Bytes<W>*>(outr + static_cast<int64_t>(c) * W) = o;
    }
  }
}

template <typename T, Fp8Format F>
cudaError_t LaunchRmsNorm(const DeviceProps& props, const T* x, const T* w, int64_t rows, int n, float eps, float* rstd,
                          uint8_t* out, float* amax, float* scale_inv, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  const bool vec = n % V == 0 && Aligned16(x) && Aligned16(w) && reinterpret_cast<uintptr_t>(out) % V == 0;
  const void* kernel = vec ? reinterpret_cast<const void*>(RmsNormFp8Kernel<T, F, V>)
                           : reinterpret_cast<const void*>(RmsNormFp8Kernel<T, F, 1>);
  return LaunchCooperative(props, kernel, rows * 32, amax, stream, x, w, rows, n, eps, rstd, out, amax, scale_inv);
}

template <typename T>
cudaError_t DispatchRmsNorm(const DeviceProps& props, Fp8Format format, const void* x, const void* w, int64_t rows,
                            int n, float eps, float* rstd, uint8_t* out, float* amax, float* scale_inv,
                            cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  return format == Fp8Format::kE4M3
             ? LaunchRmsNorm<T, Fp8Format::kE4M3>(props, xt, wt, rows, n, eps, rstd, out, amax, scale_inv, stream)
             : LaunchRmsNorm<T, Fp8Format::kE5M2>(props, xt, wt, rows, n, eps, rstd, out, amax, scale_inv, stream);
}

}  // namespace

cudaError_t Fp8CastAmax(const DeviceProps& props, DType dtype, Fp8Format format, const void* x, int64_t n,
                        uint8_t* out, float* amax, float* scale_inv, cudaStream_t stream) {
  if (n < 0 || amax == nullptr || scale_inv == nullptr) return cudaErrorInvalidValue;
  if (n > 0 && (x == nullptr || out == nullptr)) return cudaErrorInvalidValue;
  return DispatchElementwise<Plain>(props, dtype, format, n, out, amax, scale_inv, stream, x);
}

cudaError_t SwiGluFp8(const DeviceProps& props, DType dtype, Fp8Format format, const void* gate, const void* up,
                      int64_t n, uint8_t* out, float* amax, float* scale_inv, cudaStream_t stream) {
  if (n < 0 || amax == nullptr || scale_inv == nullptr) return cudaErrorInvalidValue;
  if (n > 0 && (gate == nullptr || up == nullptr || out == nullptr)) return cudaErrorInvalidValue;
  return DispatchElementwise<SiluProduct>(props, dtype, format, n, out, amax, scale_inv, stream, gate, up);
}

cudaError_t RmsNormFp8(const DeviceProps& props, DType dtype, Fp8Format format, const void* x, const void* w,
                       int64_t rows, int64_t n, float eps, float* rstd, uint8_t* out, float* amax, float* scale_inv,
                       cudaStream_t stream) {
  if (rows < 0 || n < 1 || n >= (int64_t{1} << 31) || amax == nullptr || scale_inv == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (rows > 0 && (x == nullptr || w == nullptr || rstd == nullptr || out == nullptr)) return cudaErrorInvalidValue;
  const int ni = static_cast<int>(n);
  return dtype == DType::kF32
             ? DispatchRmsNorm<float>(props, format, x, w, rows, ni, eps, rstd, out, amax, scale_inv, stream)
             : DispatchRmsNorm<__nv_bfloat16>(props, format, x, w, rows, ni, eps, rstd, out, amax, scale_inv, stream);
}

}  // namespace ftd::kernels
