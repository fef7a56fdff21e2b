// Device helpers shared by the kernel families: typed loads/stores that convert to and from fp32,
// 16-byte vector access, warp and block reductions, programmatic dependent launches. Included by .cu
// files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common.h"

namespace ftd::kernels::detail {

// fp32 <-> storage type T (fp32 or bf16): bf16 widened exactly, rounded to nearest even. Host and device,
// so per-thread work written with them can also run on the CPU.
template <typename T>
__host__ __device__ __forceinline__ float ToFloat(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return __bfloat162float(v);
}
template <typename T>
__host__ __device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return __float2bfloat16_rn(v);
}

// Elements of T in one 16-byte vector.
template <typename T>
inline constexpr int kVec = 16 / sizeof(T);

// A 16-byte vector of T, loaded/stored in one instruction (the pointer must be 16-byte aligned).
template <typename T>
struct alignas(16) Vec {
  T v[kVec<T>];
};

template <typename T>
__device__ __forceinline__ Vec<T> LoadVec(const T* p) {
  return *reinterpret_cast<const Vec<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const Vec<T>& v) {
  *reinterpret_cast<Vec<T>*>(p) = v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats in shared memory.
// Must be called by every thread of the block.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return WarpSum(v);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Programmatic dependent launch (sm_90+; the device side is a no-op before). A kernel that LaunchPdl starts
// with `pdl` may begin while the previous work in the stream is still finishing, so it calls
// GridDependencyWait() before its first access to global memory: that returns once the previous work has
// completed and its writes are visible. LaunchDependents() lets the next such kernel in the stream be
// scheduled (its blocks then wait in their GridDependencyWait()).
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void LaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel`; with `pdl` (sm_90+ devices only, DeviceProps::HasBulkCopy), as a programmatic
// dependent launch.
template <typename... Params, typename... Args>
cudaError_t LaunchPdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace ftd::kernels::detail
