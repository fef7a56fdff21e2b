// RMSNorm (LLaMA), forward and backward, fused: one read of every input and one write of every output.
//
// Forward (RmsNormForward):
//   x:    (rows, n) dtype, row-major          (read)
//   w:    (n)       dtype                     (read)
//   y:    (rows, n) dtype                     (=)  y = round(w * x * rstd), may alias x
//   rstd: (rows)    fp32                      (=)  rstd = 1 / sqrt(mean(x^2) + eps)
// Backward (RmsNormBackward), with g = dy * w and xhat = x * rstd:
//   dy, x: (rows, n) dtype; w: (n) dtype; rstd: (rows) fp32      (read)
//   dx:   (rows, n) dtype                     (=)  dx = rstd * (g - xhat * mean(g * xhat)), may alias dy
//   dw:   (n)       dtype                     (=)  dw = sum over rows of dy * xhat
//   workspace: fp32 (P, n) per-block partial sums of dw, P <= min(rows, kMaxPartials) blocks.
// dtype: kF32 or kBF16 storage; all arithmetic is fp32 (bf16 inputs widened exactly, outputs rounded to
// nearest even once). fp32 outputs match a float64 reference to ~1e-6 relative; bf16 outputs to their own
// rounding (2^-9 relative) plus accumulation order.
//
// Determinism: dw is reduced without atomics. Each block of the backward owns a fixed set of rows and
// accumulates their dy * xhat per column in a fixed order (each column owned by one thread), and writes
// one partial row; a second kernel sums the P partial rows of each column in a fixed order. Same inputs
// on the same device give bitwise the same dw.
//
// Paths (picked per call; every one is exercised by rmsnorm_test.cc):
//   pipelined (fast; sm_90 and newer): n % V == 0 (V = 16 / sizeof(dtype): 8 bf16, 4 fp32), the base
//     pointers 16-byte aligned (so every row is), and n / V <= kPipeThreads * kMaxChunks (n <= 8192 bf16,
//     4096 fp32). A block of T threads (a multiple of 32, T * K >= n / V) works on one row at a time;
//     thread t owns the 16-byte vectors t, t + T, ..., t + (K - 1) * T of every row, so w (widened to
//     fp32) and, in the backward, the thread's share of dw stay in its registers for the whole launch.
//     The forward takes K = kMaxChunks (fewer instructions per row, more blocks per multiprocessor), the
//     backward the fewest K that fit (its registers hold K vectors of dy, x, w and dw). Rows reach shared
//     memory through the bulk copy engine (cp.async.bulk, one copy per row and tensor, completing on an
//     mbarrier) into a ring of S stages, up to S - 1 rows ahead of the row being computed: the bytes in
//     flight do not depend on registers or on the warps being busy elsewhere. Per row, one
//     __syncthreads: the row reduction (warp shuffles, then one value per warp through a double-buffered
//     scratch), which also tells thread 0 that every thread has its values of the stage in registers, so
//     it refills that stage at once. Forward: block b handles the rows b * R, ..., b * R + R - 1
//     (R <= kFwdRowsPerBlock), so the block scheduler balances the multiprocessors to the end. Backward:
//     a persistent grid (what is resident at once, at most kMaxPartials blocks); block b handles rows b,
//     b + grid, ... (a fixed assignment: dw's partial sums must not depend on timing). These kernels and
//     the dw reduction are launched as programmatic dependent
//     launches (each may be scheduled while the previous kernel in the stream drains, and waits for it
//     before touching global memory) and ask for the largest shared-memory carveout, so that
//     back-to-back launches do not reconfigure the multiprocessors.
//   looped (any n): a block per row, two passes over the row (the second re-reads from L1/L2), 16-byte
//     vectors when n % V == 0 and the pointers are aligned, scalar elements otherwise (odd n such as 4097,
//     or unaligned views). The backward accumulates dw directly in its block's partial row (each column
//     owned by one thread, so no races). Also the fallback on devices older than sm_90.
#include <algorithm>
#include <climits>
#include <mutex>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/rmsnorm.h"

namespace ftd::kernels {
namespace {

using detail::BlockSum;
using detail::FromFloat;
using detail::ToFloat;
using detail::WarpSum;

constexpr int kPipeThreads = 512;      // pipelined path: most threads of a block
constexpr int kMaxChunks = 2;          // pipelined path: most 16-byte vectors a thread owns per row
constexpr int kMaxStages = 8;          // pipelined path: most rows (of each tensor) in shared memory per block
constexpr int kStageAlign = 128;       // pipelined path: bytes; each row's place in a stage starts so aligned
constexpr int kPipeSmemPerSm = 200 * 1024;  // pipelined path: stage bytes per multiprocessor (of 228 KB)
constexpr int64_t kFwdRowsPerBlock = 4;     // pipelined forward: most rows of one block
constexpr int kLoopThreads = 512;      // looped path: threads of a block (one row at a time)
constexpr int64_t kMaxPartials = 512;  // upper bound on backward blocks, hence on workspace rows

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// W consecutive elements moved as one access: a 16-byte vector when W * sizeof(T) == 16, else scalars.
template <typename T, int W>
struct alignas(W * sizeof(T)) Chunk {
  T v[W];
};
template <typename T, int W>
__device__ __forceinline__ Chunk<T, W> LoadChunk(const T* p) {
  return *reinterpret_cast<const Chunk<T, W>*>(p);
}
template <typename T, int W>
__device__ __forceinline__ void StoreChunk(T* p, const Chunk<T, W>& c) {
  *reinterpret_cast<Chunk<T, W>*>(p) = c;
}

// A chunk of zeros: the value of a chunk past the end of the row (never stored).
template <typename T, int W>
__device__ __forceinline__ Chunk<T, W> ZeroChunk() {
  Chunk<T, W> c;
#pragma unroll
  for (int j = 0; j < W; ++j) c.v[j] = FromFloat<T>(0.f);
  return c;
}

// ---------------------------------------------------------------------------------------------------
// Pipelined path. blockDim = (T); dynamic shared memory = S stages of `stride` bytes (forward: the x row;
// backward: the dy row, then the x row at stride / 2). Stage s is filled for the block's rows number s,
// s + S, s + 2S, ... (counting the block's own rows from 0; its j-th fill completes phase j of mbarrier
// full[s]).

// Bytes of one row's place in a stage.
__host__ __device__ __forceinline__ uint32_t RowStride(uint32_t row_bytes) {
  return (row_bytes + kStageAlign - 1) / kStageAlign * kStageAlign;
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Orders the mbarrier inits before the bulk copies that complete on them.
__device__ __forceinline__ void FenceMbarInit() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Arrives (the barrier's one expected arrival) and adds `bytes` to the transaction count of this phase.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory through
// the bulk copy engine; completes `bytes` transactions on `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Waits until the phase of `bar` with the given parity has completed.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
#endif

// Programmatic dependent launch (sm_90+; no-ops before). The kernels of this file that the launcher starts
// with the launch attribute that allows it (Launch below, sm_90+ only) may begin while the previous work
// in the stream is still finishing, so each calls GridDependencyWait() before its first access to global
// memory: it returns once that work has completed and its writes are visible. LaunchDependents() lets
// the next such kernel in the stream be scheduled (its blocks then wait in their GridDependencyWait()).
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

// w widened to fp32 for the vectors this thread owns (zeros past the end of the row).
template <typename T, int W, int K>
__device__ __forceinline__ void LoadWeights(const T* w, int nc, float (&wf)[K][W]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    const Chunk<T, W> v = c < nc ? LoadChunk<T, W>(w + static_cast<int64_t>(c) * W) : ZeroChunk<T, W>();
#pragma unroll
    for (int j = 0; j < W; ++j) wf[k][j] = ToFloat(v.v[j]);
  }
}

// Sum over the block of every thread's `v` (same value, bitwise, in every thread: every warp runs the
// same butterfly over the same per-warp sums). `scratch` holds kPipeThreads / 32 floats; callers
// alternate between two of them, so one barrier per call suffices: a buffer is written again only after
// the next call's barrier, which every thread reaches after its reads. The barrier also orders every
// thread's earlier shared-memory reads before what thread 0 does after it.
__device__ __forceinline__ float PipeBlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  v = WarpSum(v);
  if (lane == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  return WarpSum(lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.f);
}

template <typename T, int W, int K>
__global__ void __launch_bounds__(kPipeThreads, 2)
    RmsNormFwdPipe(const T* x, const T* w, T* y, float* rstd, int64_t rows, int n, float eps, int stages,
                   int64_t rows_per_block) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  __shared__ float scratch[2][kPipeThreads / 32];
  const int tid = threadIdx.x, nt = blockDim.x, nc = n / W;
  const int64_t first = blockIdx.x * rows_per_block, step = 1, count = min(rows_per_block, rows - first);
  const uint32_t row_bytes = static_cast<uint32_t>(n) * sizeof(T), stride = RowStride(row_bytes);
  const uint32_t bar0 = SmemAddr(full), mem0 = SmemAddr(stage_mem);
  GridDependencyWait();
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) MbarInit(bar0 + 8 * s, 1);
    FenceMbarInit();
    for (int s = 0; s < stages && s < count; ++s) {
      MbarArriveExpectTx(bar0 + 8 * s, row_bytes);
      BulkLoad(mem0 + s * stride, x + (first + s * step) * n, row_bytes, bar0 + 8 * s);
    }
  }
  float wf[K][W];
  LoadWeights<T, W, K>(w, nc, wf);
  __syncthreads();  // the barriers are initialised
  const float inv_n = 1.f / static_cast<float>(n);
  int s = 0;
  uint32_t parity = 0;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j * step;
    const T* xs = reinterpret_cast<const T*>(stage_mem + s * stride);
    MbarWait(bar0 + 8 * s, parity);
    Chunk<T, W> xv[K];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tid + k * nt;
      xv[k] = c < nc ? LoadChunk<T, W>(xs + c * W) : ZeroChunk<T, W>();
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float f = ToFloat(xv[k].v[i]);
        ss += f * f;
      }
    }
    ss = PipeBlockSum(ss, scratch[j & 1]);
    if (tid == 0 && j + stages < count) {  // every thread holds its values of stage s: refill it
      MbarArriveExpectTx(bar0 + 8 * s, row_bytes);
      BulkLoad(mem0 + s * stride, x + (row + stages * step) * n, row_bytes, bar0 + 8 * s);
    }
    const float r = rsqrtf(ss * inv_n + eps);
    if (tid == 0) rstd[row] = r;
    T* yr = y + row * n;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tid + k * nt;
      if (c < nc) {
        Chunk<T, W> o;
#pragma unroll
        for (int i = 0; i < W; ++i) o.v[i] = FromFloat<T>(ToFloat(xv[k].v[i]) * r * wf[k][i]);
        StoreChunk<T, W>(yr + static_cast<int64_t>(c) * W, o);
      }
    }
    if (++s == stages) {
      s = 0;
      parity ^= 1u;
    }
  }
  LaunchDependents();
#else
  __trap();  // the launcher picks this path on sm_90 and newer only
#endif
}

template <typename T, int W, int K>
__global__ void __launch_bounds__(kPipeThreads, K == 1 ? 2 : 1)
    RmsNormBwdPipe(const T* dy, const T* x, const T* w, const float* rstd, T* dx, float* partial, int64_t rows, int n,
                   int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stage_mem[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  __shared__ float scratch[2][kPipeThreads / 32];
  const int tid = threadIdx.x, nt = blockDim.x, nc = n / W;
  const int64_t first = blockIdx.x, step = gridDim.x, count = (rows - 1 - first) / step + 1;
  const uint32_t row_bytes = static_cast<uint32_t>(n) * sizeof(T), half = RowStride(row_bytes), stride = 2 * half;
  const uint32_t bar0 = SmemAddr(full), mem0 = SmemAddr(stage_mem);
  GridDependencyWait();
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) MbarInit(bar0 + 8 * s, 1);
    FenceMbarInit();
    for (int s = 0; s < stages && s < count; ++s) {
      const int64_t off = (first + s * step) * n;
      MbarArriveExpectTx(bar0 + 8 * s, 2 * row_bytes);
      BulkLoad(mem0 + s * stride, dy + off, row_bytes, bar0 + 8 * s);
      BulkLoad(mem0 + s * stride + half, x + off, row_bytes, bar0 + 8 * s);
    }
  }
  float wf[K][W], acc[K][W];
  LoadWeights<T, W, K>(w, nc, wf);
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int i = 0; i < W; ++i) acc[k][i] = 0.f;
  }
  float r_next = rstd[first];  // rstd of the next row, loaded one row ahead
  __syncthreads();             // the barriers are initialised
  const float inv_n = 1.f / static_cast<float>(n);
  int s = 0;
  uint32_t parity = 0;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j * step;
    const float r = r_next;
    if (j + 1 < count) r_next = rstd[row + step];
    const T* dys = reinterpret_cast<const T*>(stage_mem + s * stride);
    const T* xs = reinterpret_cast<const T*>(stage_mem + s * stride + half);
    MbarWait(bar0 + 8 * s, parity);
    Chunk<T, W> dyv[K], xv[K];
    float dot = 0.f;  // sum of g * x over the row
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tid + k * nt;
      dyv[k] = c < nc ? LoadChunk<T, W>(dys + c * W) : ZeroChunk<T, W>();
      xv[k] = c < nc ? LoadChunk<T, W>(xs + c * W) : ZeroChunk<T, W>();
#pragma unroll
      for (int i = 0; i < W; ++i) dot += ToFloat(dyv[k].v[i]) * wf[k][i] * ToFloat(xv[k].v[i]);
    }
    dot = PipeBlockSum(dot, scratch[j & 1]);
    if (tid == 0 && j + stages < count) {  // every thread holds its values of stage s: refill it
      const int64_t off = (row + stages * step) * n;
      MbarArriveExpectTx(bar0 + 8 * s, 2 * row_bytes);
      BulkLoad(mem0 + s * stride, dy + off, row_bytes, bar0 + 8 * s);
      BulkLoad(mem0 + s * stride + half, x + off, row_bytes, bar0 + 8 * s);
    }
    const float mean_gxhat = dot * r * inv_n;  // mean(g * xhat)
    T* dxr = dx + row * n;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tid + k * nt;
      if (c < nc) {
        Chunk<T, W> o;
#pragma unroll
        for (int i = 0; i < W; ++i) {
          const float d = ToFloat(dyv[k].v[i]);
          const float xh = ToFloat(xv[k].v[i]) * r;
          o.v[i] = FromFloat<T>(r * (d * wf[k][i] - xh * mean_gxhat));
          acc[k][i] += d * xh;
        }
        StoreChunk<T, W>(dxr + static_cast<int64_t>(c) * W, o);
      }
    }
    if (++s == stages) {
      s = 0;
      parity ^= 1u;
    }
  }
  LaunchDependents();
  float* pr = partial + static_cast<int64_t>(blockIdx.x) * n;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = tid + k * nt;
    if (c < nc) {
#pragma unroll
      for (int i = 0; i < W; ++i) pr[static_cast<int64_t>(c) * W + i] = acc[k][i];
    }
  }
#else
  __trap();  // the launcher picks this path on sm_90 and newer only
#endif
}

// ---------------------------------------------------------------------------------------------------
// Looped path: one row per block at a time (1-D blocks), any n; W = V (aligned) or 1 (scalar).

template <typename T, int W>
__global__ void __launch_bounds__(kLoopThreads)
    RmsNormFwdLooped(const T* x, const T* w, T* y, float* rstd, int64_t rows, int n, float eps) {
  __shared__ float scratch[32];
  const int nc = n / W;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    float ss = 0.f;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
      const Chunk<T, W> xv = LoadChunk<T, W>(xr + static_cast<int64_t>(c) * W);
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const float f = ToFloat(xv.v[j]);
        ss += f * f;
      }
    }
    ss = BlockSum(ss, scratch);
    const float r = rsqrtf(ss / static_cast<float>(n) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
      const Chunk<T, W> xv = LoadChunk<T, W>(xr + static_cast<int64_t>(c) * W);
      const Chunk<T, W> wv = LoadChunk<T, W>(w + static_cast<int64_t>(c) * W);
      Chunk<T, W> o;
#pragma unroll
      for (int j = 0; j < W; ++j) o.v[j] = FromFloat<T>(ToFloat(xv.v[j]) * r * ToFloat(wv.v[j]));
      StoreChunk<T, W>(yr + static_cast<int64_t>(c) * W, o);
    }
  }
}

template <typename T, int W>
__global__ void __launch_bounds__(kLoopThreads) RmsNormBwdLooped(const T* dy, const T* x, const T* w, const float* rstd,
                                                                 T* dx, float* partial, int64_t rows, int n) {
  __shared__ float scratch[32];
  const int nc = n / W;
  const float inv_n = 1.f / static_cast<float>(n);
  // This block's dw partial row; column c * W + j is only ever touched by thread c % blockDim.x.
  float* acc = partial + static_cast<int64_t>(blockIdx.x) * n;
  for (int c = threadIdx.x; c < nc; c += blockDim.x) {
#pragma unroll
    for (int j = 0; j < W; ++j) acc[static_cast<int64_t>(c) * W + j] = 0.f;
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * n;
    const T* xr = x + row * n;
    T* dxr = dx + row * n;
    const float r = rstd[row];
    float dot = 0.f;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
      const Chunk<T, W> dv = LoadChunk<T, W>(dyr + static_cast<int64_t>(c) * W);
      const Chunk<T, W> xv = LoadChunk<T, W>(xr + static_cast<int64_t>(c) * W);
      const Chunk<T, W> wv = LoadChunk<T, W>(w + static_cast<int64_t>(c) * W);
#pragma unroll
      for (int j = 0; j < W; ++j) dot += ToFloat(dv.v[j]) * ToFloat(wv.v[j]) * ToFloat(xv.v[j]);
    }
    dot = BlockSum(dot, scratch);  // also orders this row's reads of dy before the writes of dx below
    const float mean_gxhat = dot * r * inv_n;
    for (int c = threadIdx.x; c < nc; c += blockDim.x) {
      const Chunk<T, W> dv = LoadChunk<T, W>(dyr + static_cast<int64_t>(c) * W);
      const Chunk<T, W> xv = LoadChunk<T, W>(xr + static_cast<int64_t>(c) * W);
      const Chunk<T, W> wv = LoadChunk<T, W>(w + static_cast<int64_t>(c) * W);
      Chunk<T, W> o;
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const float d = ToFloat(dv.v[j]);
        const float xh = ToFloat(xv.v[j]) * r;
        o.v[j] = FromFloat<T>(r * (d * ToFloat(wv.v[j]) - xh * mean_gxhat));
        acc[static_cast<int64_t>(c) * W + j] += d * xh;
      }
      StoreChunk<T, W>(dxr + static_cast<int64_t>(c) * W, o);
    }
  }
}

// dw[c] = sum over p < P of partial[p, c], in a fixed order. Block (32, 32): lane x = column, y = a
// strided subset of the partial rows; the 32 subtotals are then added as a fixed tree. P == 0 gives 0.
template <typename T>
__global__ void __launch_bounds__(1024) RmsNormDwReduce(const float* partial, int64_t P, int n, T* dw) {
  __shared__ float sub[32][33];
  GridDependencyWait();
  const int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
  float s = 0.f;
  if (c < n) {
#pragma unroll 8
    for (int64_t p = y; p < P; p += 32) s += partial[p * n + c];
  }
  sub[y][threadIdx.x] = s;
  for (int h = 16; h > 0; h >>= 1) {  // a fixed tree over y
    __syncthreads();
    if (y < h) sub[y][threadIdx.x] += sub[y + h][threadIdx.x];
  }
  if (y == 0 && c < n) dw[c] = FromFloat<T>(sub[0][threadIdx.x]);
}

// ---------------------------------------------------------------------------------------------------
// Launch helpers.

// Per device, cached: the multiprocessor count and whether the pipelined path runs there (sm_90+).
struct DeviceInfo {
  int sms = 1;
  bool pipelined = false;
};
DeviceInfo GetDeviceInfo(int device) {
  static std::mutex mu;
  static std::vector<std::pair<int, DeviceInfo>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& e : cache) {
      if (e.first == device) return e.second;
    }
  }
  DeviceInfo info;
  int sms = 0, major = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();  // clear; the launch reports any real problem
    return info;
  }
  info.sms = std::max(1, sms);
  info.pipelined = major >= 9;
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace_back(device, info);
  return info;
}

// Blocks of `kernel` with `threads` threads resident at once on the current device (multiprocessors x
// blocks per multiprocessor), cached per (device, kernel, threads): the query is host-only but not free.
int ResidentBlocks(const void* kernel, int threads) {
  struct Entry {
    int device;
    const void* kernel;
    int threads;
    int blocks;
  };
  static std::mutex mu;
  static std::vector<Entry> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Entry& e : cache) {
      if (e.device == device && e.kernel == kernel && e.threads == threads) return e.blocks;
    }
  }
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  const int blocks = std::max(1, GetDeviceInfo(device).sms * std::max(per_sm, 1));
  std::lock_guard<std::mutex> lock(mu);
  cache.push_back({device, kernel, threads, blocks});
  return blocks;
}

// Row groups for a persistent pass over `rows` rows with at most `cap` groups at once: as many as
// possible, then as few as give the same number of rows to the busiest group (balances the tail).
int64_t BalancedGroups(int64_t rows, int64_t cap) {
  const int64_t groups = std::max<int64_t>(1, std::min(rows, cap));
  return CeilDiv(rows, CeilDiv(rows, groups));
}

// The pipelined path's block shape for rows of n elements (T threads owning K vectors each), or !ok
// when it does not apply. K = kMaxChunks (fewer threads, so fewer per-row instructions and more blocks
// per multiprocessor: the forward, whose registers allow it) or the fewest that fit (the backward, whose
// registers hold K vectors of dy, x, w and dw each).
struct PipeShape {
  bool ok = false;
  int threads = 0, chunks = 0;
};
template <typename T>
PipeShape PipeShapeFor(int64_t n, bool aligned, bool most_chunks) {
  constexpr int V = detail::kVec<T>;
  PipeShape s;
  if (!aligned || n % V != 0 || n / V > static_cast<int64_t>(kPipeThreads) * kMaxChunks) return s;
  const int64_t nc = n / V;
  s.chunks = most_chunks ? kMaxChunks : static_cast<int>(CeilDiv(nc, kPipeThreads));
  s.threads = static_cast<int>(CeilDiv(CeilDiv(nc, s.chunks), 32) * 32);
  s.ok = true;
  return s;
}

// How a pipelined kernel is launched on the current device for stages of `stage_bytes`: as many stages
// as give the multiprocessor about kPipeSmemPerSm bytes in flight over the blocks its registers and
// threads allow (2..kMaxStages), and the blocks resident at once with that much shared memory. Cached per
// (device, kernel, threads, stage bytes). !ok: use the looped path.
struct PipePlan {
  bool ok = false;
  int stages = 0;
  int smem = 0;
  int64_t resident = 0;
};
PipePlan PlanPipe(const void* kernel, int threads, int stage_bytes) {
  struct Entry {
    int device;
    const void* kernel;
    int threads, stage_bytes;
    PipePlan plan;
  };
  static std::mutex mu;
  static std::vector<Entry> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Entry& e : cache) {
      if (e.device == device && e.kernel == kernel && e.threads == threads && e.stage_bytes == stage_bytes) return e.plan;
    }
  }
  const DeviceInfo info = GetDeviceInfo(device);
  PipePlan p;
  int by_regs = 0, per_sm = 0;
  // The largest shared-memory carveout: the one these kernels need, so that consecutive launches of them
  // (and of RmsNormDwReduce, PreferMaxShared) find the multiprocessors already configured.
  if (info.pipelined &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPipeSmemPerSm) == cudaSuccess &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) ==
          cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, kernel, threads, 0) == cudaSuccess && by_regs > 0) {
    p.stages = std::clamp(kPipeSmemPerSm / by_regs / stage_bytes, 2, kMaxStages);
    p.smem = p.stages * stage_bytes;
    if (p.smem <= kPipeSmemPerSm &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, p.smem) == cudaSuccess && per_sm > 0) {
      p.resident = static_cast<int64_t>(info.sms) * per_sm;
      p.ok = true;
    }
  }
  cudaGetLastError();  // clear any failed query: the looped path is taken instead
  std::lock_guard<std::mutex> lock(mu);
  cache.push_back({device, kernel, threads, stage_bytes, p});
  return p;
}

// Asks for the largest shared-memory carveout for `kernel` on the current device (once per device and
// kernel); a hint, failures ignored.
void PreferMaxShared(const void* kernel) {
  static std::mutex mu;
  static std::vector<std::pair<int, const void*>> done;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& e : done) {
    if (e.first == device && e.second == kernel) return;
  }
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) !=
      cudaSuccess) {
    cudaGetLastError();
  }
  done.emplace_back(device, kernel);
}

// Launches `kernel`; with `pdl` (sm_90+ only), as a programmatic dependent launch: it may be scheduled
// while the previous kernel in the stream finishes, and waits for it in GridDependencyWait().
template <typename... Params, typename... Args>
cudaError_t Launch(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
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

bool CurrentDevicePipelined() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return GetDeviceInfo(device).pipelined;
}

int LoopThreads(int64_t chunks) { return static_cast<int>(std::min<int64_t>(kLoopThreads, CeilDiv(chunks, 32) * 32)); }

constexpr int64_t kMaxGrid = INT_MAX;

template <typename T>
cudaError_t Forward(const T* x, const T* w, T* y, float* rstd, int64_t rows, int n, float eps, cudaStream_t stream) {
  constexpr int V = detail::kVec<T>;
  const bool aligned = detail::Aligned16(x) && detail::Aligned16(w) && detail::Aligned16(y);
  const PipeShape s = PipeShapeFor<T>(n, aligned, /*most_chunks=*/true);
  if (s.ok) {
    auto* kernel = RmsNormFwdPipe<T, V, kMaxChunks>;
    const int stage_bytes = static_cast<int>(RowStride(static_cast<uint32_t>(n) * sizeof(T)));
    const PipePlan p = PlanPipe(reinterpret_cast<const void*>(kernel), s.threads, stage_bytes);
    if (p.ok) {
      // A few consecutive rows per block, fewer when that leaves multiprocessors idle; the block scheduler
      // hands the next block to whichever multiprocessor frees a slot first, which balances the end.
      const int64_t per_block = std::max(std::clamp<int64_t>(CeilDiv(rows, p.resident), 1, kFwdRowsPerBlock),
                                         CeilDiv(rows, kMaxGrid));
      const int stages = static_cast<int>(std::min<int64_t>(p.stages, per_block));
      return Launch(true, kernel, dim3(static_cast<unsigned>(CeilDiv(rows, per_block))), dim3(s.threads),
                    static_cast<size_t>(stages) * stage_bytes, stream, x, w, y, rstd, rows, n, eps, stages, per_block);
    }
  }
  if (aligned && n % V == 0) {
    RmsNormFwdLooped<T, V><<<static_cast<unsigned>(std::min(rows, kMaxGrid)), LoopThreads(n / V), 0, stream>>>(
        x, w, y, rstd, rows, n, eps);
  } else {
    RmsNormFwdLooped<T, 1>
        <<<static_cast<unsigned>(std::min(rows, kMaxGrid)), LoopThreads(n), 0, stream>>>(x, w, y, rstd, rows, n, eps);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t Backward(const T* dy, const T* x, const T* w, const float* rstd, T* dx, T* dw, float* partial, int64_t rows,
                     int n, cudaStream_t stream) {
  constexpr int V = detail::kVec<T>;
  const bool aligned = detail::Aligned16(dy) && detail::Aligned16(x) && detail::Aligned16(w) && detail::Aligned16(dx);
  int64_t blocks = 0;
  if (rows > 0) {
    const PipeShape s = PipeShapeFor<T>(n, aligned, /*most_chunks=*/false);
    cudaError_t e = cudaSuccess;
    if (s.ok) {
      auto* kernel = s.chunks == 1 ? RmsNormBwdPipe<T, V, 1> : RmsNormBwdPipe<T, V, 2>;
      const int stage_bytes = 2 * static_cast<int>(RowStride(static_cast<uint32_t>(n) * sizeof(T)));
      const PipePlan p = PlanPipe(reinterpret_cast<const void*>(kernel), s.threads, stage_bytes);
      if (p.ok) {
        blocks = std::min({rows, p.resident, kMaxPartials});
        e = Launch(true, kernel, dim3(static_cast<unsigned>(blocks)), dim3(s.threads), p.smem, stream, dy, x, w, rstd,
                   dx, partial, rows, n, p.stages);
      }
    }
    if (blocks == 0) {
      const bool vec = aligned && n % V == 0;
      auto* kernel = vec ? RmsNormBwdLooped<T, V> : RmsNormBwdLooped<T, 1>;
      const int threads = LoopThreads(vec ? n / V : n);
      blocks =
          std::min(BalancedGroups(rows, ResidentBlocks(reinterpret_cast<const void*>(kernel), threads)), kMaxPartials);
      kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(dy, x, w, rstd, dx, partial, rows, n);
      e = cudaGetLastError();
    }
    if (e != cudaSuccess) return e;
  }
  const bool pdl = CurrentDevicePipelined();
  if (pdl) PreferMaxShared(reinterpret_cast<const void*>(RmsNormDwReduce<T>));
  return Launch(pdl, RmsNormDwReduce<T>, dim3(static_cast<unsigned>(CeilDiv(n, 32))), dim3(32, 32), 0, stream,
                static_cast<const float*>(partial), blocks, n, dw);
}

bool SizesOk(int64_t rows, int64_t n) { return rows >= 0 && n >= 1 && n <= INT_MAX; }

}  // namespace

cudaError_t RmsNormForward(DType dtype, const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t n,
                           float eps, cudaStream_t stream) {
  if (!SizesOk(rows, n) || x == nullptr || w == nullptr || y == nullptr || rstd == nullptr)
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int nn = static_cast<int>(n);
  if (dtype == DType::kF32) {
    return Forward(static_cast<const float*>(x), static_cast<const float*>(w), static_cast<float*>(y), rstd, rows, nn,
                   eps, stream);
  }
  return Forward(static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
                 static_cast<__nv_bfloat16*>(y), rstd, rows, nn, eps, stream);
}

size_t RmsNormBackwardWorkspaceBytes(int64_t rows, int64_t n) {
  if (!SizesOk(rows, n)) return 0;
  return static_cast<size_t>(std::min(rows, kMaxPartials)) * static_cast<size_t>(n) * sizeof(float);
}

cudaError_t RmsNormBackward(DType dtype, const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                            void* dw, void* workspace, int64_t rows, int64_t n, cudaStream_t stream) {
  if (!SizesOk(rows, n) || w == nullptr || dw == nullptr) return cudaErrorInvalidValue;
  if (rows > 0 && (dy == nullptr || x == nullptr || rstd == nullptr || dx == nullptr || workspace == nullptr ||
                   (reinterpret_cast<uintptr_t>(workspace) & 3u) != 0)) {
    return cudaErrorInvalidValue;
  }
  const int nn = static_cast<int>(n);
  float* partial = static_cast<float*>(workspace);
  if (dtype == DType::kF32) {
    return Backward(static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(w), rstd,
                    static_cast<float*>(dx), static_cast<float*>(dw), partial, rows, nn, stream);
  }
  return Backward(static_cast<const __nv_bfloat16*>(dy), static_cast<const __nv_bfloat16*>(x),
                  static_cast<const __nv_bfloat16*>(w), rstd, static_cast<__nv_bfloat16*>(dx),
                  static_cast<__nv_bfloat16*>(dw), partial, rows, nn, stream);
}

}  // namespace ftd::kernels
