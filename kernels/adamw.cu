// AdamW as one multi-tensor step, and a multi-tensor sum of squares (for the global gradient norm).
//
// AdamWStep, per tensor (numel elements each):
//   grad:              (numel) grad dtype                (read)
//   param:             (numel) param dtype               (+= update, in place; only written when master is set)
//   master:            (numel) fp32, optional            (+= update, in place)
//   exp_avg, exp_avg_sq: (numel) moment dtype            (updated in place)
//   step, grad_scale, found_inf: device fp32 scalars     (read)
// Per element, all in fp32 (w = master when set, else param):
//   g = grad * grad_scale
//   w = w * (1 - lr * wd)                                        decoupled weight decay
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g
//   w = w - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),        bc1 = 1 - b1^step, bc2 = 1 - b2^step
//   store w (master, then param = round(w)), m, v (rounded to the moment dtype)
// This is torch._fused_adamw_'s update (which computes some of these products in float64: results agree
// to a few fp32 ulps). bc1, bc2 are computed on the device as -expm1(step * log1p(b - 1)) (accurate for
// b near 1 and any step), so the step count never leaves the device. When *found_inf != 0 every block
// returns before writing anything.
// Precision: fp32 results match a float64 reference to ~1e-6 relative; bf16 stores are rounded once.
//
// Multi-tensor apply: the launcher packs up to kMaxTensors descriptors (pointers, numel, weight decay,
// first block) into the kernel's parameters (passed by value as a __grid_constant__ struct, < 32 KB,
// which sm_70+ with CUDA 12.1+ allows), so one launch covers up to kMaxTensors tensors (LLaMA-8B's 291:
// one launch). Each block takes kChunk consecutive elements of one tensor, found by binary search of the
// blocks' prefix sums. A tensor whose five pointers are all 16-byte aligned takes the vector path (8
// elements per thread per step: 16-byte loads of bf16, two of fp32; the tensor's last n % 8 elements
// one by one); any other tensor is done one element per thread. Both paths are in adamw_test.cc.
//
// MultiTensorSumSquares: the same packing; each block writes the fp32 sum of squares of its kSumChunk
// elements to workspace[block] (8 running sums per thread, then a fixed-order tree); one block then
// adds all partials in float64 in a fixed order and writes out[0]. Deterministic.
#include <algorithm>
#include <climits>
#include <cstring>

#include "kernels/adamw.h"
#include "kernels/common.cuh"

namespace ftd::kernels {
namespace {

using namespace detail;  // the device helpers of common.cuh

constexpr int kThreads = 256;
constexpr int kElems = 8;             // elements per thread per vector step
constexpr int64_t kChunk = 32768;     // elements per AdamW block (16 vector steps of 256 threads)
constexpr int64_t kSumChunk = 65536;  // elements per sum-of-squares block
constexpr int kMaxTensors = 320;      // descriptors per AdamW launch
constexpr int kMaxSumTensors = 640;   // descriptors per sum-of-squares launch

// 8 consecutive elements of X (16-byte aligned) to fp32 and back.
template <typename X>
__device__ __forceinline__ void Load8(const X* p, float (&f)[kElems]) {
  constexpr int V = kVec<X>;
#pragma unroll
  for (int q = 0; q < kElems / V; ++q) {
    const Vec<X> v = LoadVec(p + q * V);
#pragma unroll
    for (int j = 0; j < V; ++j) f[q * V + j] = ToFloat(v.v[j]);
  }
}
template <typename X>
__device__ __forceinline__ void Store8(X* p, const float (&f)[kElems]) {
  constexpr int V = kVec<X>;
#pragma unroll
  for (int q = 0; q < kElems / V; ++q) {
    Vec<X> v;
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = FromFloat<X>(f[q * V + j]);
    StoreVec(p + q * V, v);
  }
}

// Block b of a launch belongs to the last tensor i with block_start[i] <= b (empty tensors are never
// packed, so block_start is strictly increasing).
__device__ __forceinline__ int FindTensor(const int* block_start, int num_tensors, int b) {
  int lo = 0, hi = num_tensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (block_start[mid] <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// ---------------------------------------------------------------------------------------------------
// AdamW.

struct AdamWArgs {
  const float* step;
  const float* grad_scale;
  const float* found_inf;
  float lr, beta1, beta2, eps;
  int num_tensors;
  int block_start[kMaxTensors];
  void* param[kMaxTensors];
  float* master[kMaxTensors];
  const void* grad[kMaxTensors];
  void* exp_avg[kMaxTensors];
  void* exp_avg_sq[kMaxTensors];
  int64_t numel[kMaxTensors];
  float weight_decay[kMaxTensors];
  bool vec[kMaxTensors];
};
static_assert(sizeof(AdamWArgs) <= 32764, "kernel parameters are limited to 32764 bytes");

struct Hyper {
  float scale, decay, b1, b2, omb1, omb2, step_size, inv_bc2_sqrt, eps;
};

__device__ __forceinline__ void Update(float& w, float g, float& m, float& v, const Hyper& h) {
  g *= h.scale;
  w *= h.decay;
  m = h.b1 * m + h.omb1 * g;
  v = h.b2 * v + h.omb2 * g * g;
  const float denom = sqrtf(v) * h.inv_bc2_sqrt + h.eps;
  w -= h.step_size * m / denom;
}

template <typename P, typename G, typename M>
__global__ void __launch_bounds__(kThreads) AdamWKernel(const __grid_constant__ AdamWArgs a) {
  if (a.found_inf != nullptr && *a.found_inf != 0.f) return;
  const int ti = FindTensor(a.block_start, a.num_tensors, static_cast<int>(blockIdx.x));
  const int64_t begin = static_cast<int64_t>(static_cast<int>(blockIdx.x) - a.block_start[ti]) * kChunk;
  const int64_t end = a.numel[ti] < begin + kChunk ? a.numel[ti] : begin + kChunk;

  const float step = *a.step;
  Hyper h;
  h.scale = a.grad_scale != nullptr ? *a.grad_scale : 1.f;
  h.decay = 1.f - a.lr * a.weight_decay[ti];
  h.b1 = a.beta1;
  h.b2 = a.beta2;
  h.omb1 = 1.f - a.beta1;
  h.omb2 = 1.f - a.beta2;
  const float bc1 = -expm1f(step * log1pf(a.beta1 - 1.f));  // 1 - b1^step
  const float bc2 = -expm1f(step * log1pf(a.beta2 - 1.f));  // 1 - b2^step
  h.step_size = a.lr / bc1;
  h.inv_bc2_sqrt = 1.f / sqrtf(bc2);
  h.eps = a.eps;

  P* param = static_cast<P*>(a.param[ti]);
  float* master = a.master[ti];
  const G* grad = static_cast<const G*>(a.grad[ti]);
  M* exp_avg = static_cast<M*>(a.exp_avg[ti]);
  M* exp_avg_sq = static_cast<M*>(a.exp_avg_sq[ti]);

  int64_t scalar_begin = begin;
  if (a.vec[ti]) {
    const int64_t vend = begin + (end - begin) / kElems * kElems;
    for (int64_t e = begin + static_cast<int64_t>(threadIdx.x) * kElems; e < vend; e += kThreads * kElems) {
      float w[kElems], g[kElems], m[kElems], v[kElems];
      if (master != nullptr) {
        Load8(master + e, w);
      } else {
        Load8(param + e, w);
      }
      Load8(grad + e, g);
      Load8(exp_avg + e, m);
      Load8(exp_avg_sq + e, v);
#pragma unroll
      for (int j = 0; j < kElems; ++j) Update(w[j], g[j], m[j], v[j], h);
      if (master != nullptr) Store8(master + e, w);
      Store8(param + e, w);
      Store8(exp_avg + e, m);
      Store8(exp_avg_sq + e, v);
    }
    scalar_begin = vend;
  }
  for (int64_t e = scalar_begin + threadIdx.x; e < end; e += kThreads) {
    float w = master != nullptr ? master[e] : ToFloat(param[e]);
    float m = ToFloat(exp_avg[e]), v = ToFloat(exp_avg_sq[e]);
    Update(w, ToFloat(grad[e]), m, v, h);
    if (master != nullptr) master[e] = w;
    param[e] = FromFloat<P>(w);
    exp_avg[e] = FromFloat<M>(m);
    exp_avg_sq[e] = FromFloat<M>(v);
  }
}

cudaError_t LaunchAdamW(const AdamWArgs& a, int blocks, DType pd, DType gd, DType md, cudaStream_t stream) {
  const bool pf = pd == DType::kF32, gf = gd == DType::kF32, mf = md == DType::kF32;
  using B = __nv_bfloat16;
  // One instantiation per (param, grad, moment) storage type.
  if (pf && gf && mf) AdamWKernel<float, float, float><<<blocks, kThreads, 0, stream>>>(a);
  if (pf && gf && !mf) AdamWKernel<float, float, B><<<blocks, kThreads, 0, stream>>>(a);
  if (pf && !gf && mf) AdamWKernel<float, B, float><<<blocks, kThreads, 0, stream>>>(a);
  if (pf && !gf && !mf) AdamWKernel<float, B, B><<<blocks, kThreads, 0, stream>>>(a);
  if (!pf && gf && mf) AdamWKernel<B, float, float><<<blocks, kThreads, 0, stream>>>(a);
  if (!pf && gf && !mf) AdamWKernel<B, float, B><<<blocks, kThreads, 0, stream>>>(a);
  if (!pf && !gf && mf) AdamWKernel<B, B, float><<<blocks, kThreads, 0, stream>>>(a);
  if (!pf && !gf && !mf) AdamWKernel<B, B, B><<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------------
// Sum of squares.

struct SumSqArgs {
  float* partial;  // this launch's first partial
  int num_tensors;
  int block_start[kMaxSumTensors];
  const void* grad[kMaxSumTensors];
  int64_t numel[kMaxSumTensors];
  bool vec[kMaxSumTensors];
};
static_assert(sizeof(SumSqArgs) <= 32764, "kernel parameters are limited to 32764 bytes");

template <typename G>
__global__ void __launch_bounds__(kThreads) SumSqKernel(const __grid_constant__ SumSqArgs a) {
  __shared__ float scratch[32];
  const int ti = FindTensor(a.block_start, a.num_tensors, static_cast<int>(blockIdx.x));
  const int64_t begin = static_cast<int64_t>(static_cast<int>(blockIdx.x) - a.block_start[ti]) * kSumChunk;
  const int64_t end = a.numel[ti] < begin + kSumChunk ? a.numel[ti] : begin + kSumChunk;
  const G* grad = static_cast<const G*>(a.grad[ti]);
  float acc[kElems] = {};
  int64_t scalar_begin = begin;
  if (a.vec[ti]) {
    const int64_t vend = begin + (end - begin) / kElems * kElems;
#pragma unroll 4
    for (int64_t e = begin + static_cast<int64_t>(threadIdx.x) * kElems; e < vend; e += kThreads * kElems) {
      float g[kElems];
      Load8(grad + e, g);
#pragma unroll
      for (int j = 0; j < kElems; ++j) acc[j] += g[j] * g[j];
    }
    scalar_begin = vend;
  }
  for (int64_t e = scalar_begin + threadIdx.x; e < end; e += kThreads) {
    const float g = ToFloat(grad[e]);
    acc[0] += g * g;
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  s = detail::BlockSum(s, scratch);
  if (threadIdx.x == 0) a.partial[blockIdx.x] = s;
}

// out[0] = sum of partial[0, n) in float64: per-thread strided sums, then a fixed tree.
__global__ void __launch_bounds__(1024) SumPartials(const float* partial, int64_t n, float* out) {
  __shared__ double sums[1024];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += 1024) s += partial[i];
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int width = 512; width > 0; width >>= 1) {
    if (static_cast<int>(threadIdx.x) < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = static_cast<float>(sums[0]);
}

}  // namespace

cudaError_t AdamWStep(const AdamWTensor* tensors, int num_tensors, const AdamWParams& p, const float* step,
                      const float* grad_scale, const float* found_inf, cudaStream_t stream) {
  if (num_tensors < 0 || (num_tensors > 0 && tensors == nullptr) || step == nullptr) return cudaErrorInvalidValue;
  for (int i = 0; i < num_tensors; ++i) {
    const AdamWTensor& t = tensors[i];
    if (t.numel < 0 || CeilDiv(t.numel, kChunk) > INT_MAX) return cudaErrorInvalidValue;
    if (t.numel > 0 && (t.param == nullptr || t.grad == nullptr || t.exp_avg == nullptr || t.exp_avg_sq == nullptr)) {
      return cudaErrorInvalidValue;
    }
  }
  AdamWArgs a;
  std::memset(&a, 0, sizeof(a));
  a.step = step;
  a.grad_scale = grad_scale;
  a.found_inf = found_inf;
  a.lr = p.lr;
  a.beta1 = p.beta1;
  a.beta2 = p.beta2;
  a.eps = p.eps;
  int64_t blocks = 0;
  for (int i = 0; i < num_tensors; ++i) {
    const AdamWTensor& t = tensors[i];
    if (t.numel == 0) continue;
    const int64_t nb = CeilDiv(t.numel, kChunk);
    if (a.num_tensors == kMaxTensors || blocks + nb > INT_MAX) {
      const cudaError_t e =
          LaunchAdamW(a, static_cast<int>(blocks), p.param_dtype, p.grad_dtype, p.moment_dtype, stream);
      if (e != cudaSuccess) return e;
      a.num_tensors = 0;
      blocks = 0;
    }
    const int k = a.num_tensors++;
    a.block_start[k] = static_cast<int>(blocks);
    a.param[k] = t.param;
    a.master[k] = t.master;
    a.grad[k] = t.grad;
    a.exp_avg[k] = t.exp_avg;
    a.exp_avg_sq[k] = t.exp_avg_sq;
    a.numel[k] = t.numel;
    a.weight_decay[k] = t.weight_decay;
    a.vec[k] = detail::Aligned16(t.param) && detail::Aligned16(t.grad) && detail::Aligned16(t.exp_avg) &&
               detail::Aligned16(t.exp_avg_sq) && (t.master == nullptr || detail::Aligned16(t.master));
    blocks += nb;
  }
  if (a.num_tensors == 0) return cudaSuccess;
  return LaunchAdamW(a, static_cast<int>(blocks), p.param_dtype, p.grad_dtype, p.moment_dtype, stream);
}

size_t MultiTensorSumSquaresWorkspaceBytes(const int64_t* numels, int num_tensors) {
  int64_t blocks = 0;
  for (int i = 0; i < num_tensors; ++i) blocks += numels[i] > 0 ? CeilDiv(numels[i], kSumChunk) : 0;
  return static_cast<size_t>(blocks) * sizeof(float);
}

cudaError_t MultiTensorSumSquares(const void* const* grads, const int64_t* numels, int num_tensors, DType grad_dtype,
                                  float* out, void* workspace, size_t ws_bytes, cudaStream_t stream) {
  if (num_tensors < 0 || out == nullptr || (num_tensors > 0 && (grads == nullptr || numels == nullptr))) {
    return cudaErrorInvalidValue;
  }
  for (int i = 0; i < num_tensors; ++i) {
    if (numels[i] < 0 || CeilDiv(numels[i], kSumChunk) > INT_MAX || (numels[i] > 0 && grads[i] == nullptr)) {
      return cudaErrorInvalidValue;
    }
  }
  const size_t need = MultiTensorSumSquaresWorkspaceBytes(numels, num_tensors);
  if (need > 0 && (workspace == nullptr || ws_bytes < need || (reinterpret_cast<uintptr_t>(workspace) & 3u) != 0)) {
    return cudaErrorInvalidValue;
  }
  float* partial = static_cast<float*>(workspace);
  SumSqArgs a;
  std::memset(&a, 0, sizeof(a));
  int64_t done = 0, blocks = 0;  // partials written by earlier launches; blocks of this one
  auto launch = [&]() {
    a.partial = partial + done;
    if (grad_dtype == DType::kF32) {
      SumSqKernel<float><<<static_cast<int>(blocks), kThreads, 0, stream>>>(a);
    } else {
      SumSqKernel<__nv_bfloat16><<<static_cast<int>(blocks), kThreads, 0, stream>>>(a);
    }
    done += blocks;
    a.num_tensors = 0;
    blocks = 0;
    return cudaGetLastError();
  };
  for (int i = 0; i < num_tensors; ++i) {
    if (numels[i] == 0) continue;
    const int64_t nb = CeilDiv(numels[i], kSumChunk);
    if (a.num_tensors == kMaxSumTensors || blocks + nb > INT_MAX) {
      const cudaError_t e = launch();
      if (e != cudaSuccess) return e;
    }
    const int k = a.num_tensors++;
    a.block_start[k] = static_cast<int>(blocks);
    a.grad[k] = grads[i];
    a.numel[k] = numels[i];
    a.vec[k] = detail::Aligned16(grads[i]);
    blocks += nb;
  }
  if (a.num_tensors > 0) {
    const cudaError_t e = launch();
    if (e != cudaSuccess) return e;
  }
  SumPartials<<<1, 1024, 0, stream>>>(partial, done, out);
  return cudaGetLastError();
}

}  // namespace ftd::kernels
