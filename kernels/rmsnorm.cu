// RMSNorm (LLaMA), forward and backward, fused: one read of every input and one write of every output.
//
// Planning (PlanRmsNorm, once per device, dtype and n; the caller keeps the RmsNormPlan): the block shapes,
// the ring depths and the blocks resident at once, from the device's properties (launch_plan.h).
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
// Paths (planned per device and n, picked per call by pointer alignment; every one is exercised by
// rmsnorm_test.cc):
//   pipelined (fast; sm_90 and newer): n % V == 0 (V = 16 / sizeof(dtype): 8 bf16, 4 fp32), the base
//     pointers 16-byte aligned (so every row is), and n / V <= kPipeThreads * kMaxChunks (n <= 8192 bf16,
//     4096 fp32). A block of T threads (a multiple of 32, T * K >= n / V) works on one row at a time;
//     thread t owns the 16-byte vectors t, t + T, ..., t + (K - 1) * T of every row, so w (widened to
//     fp32) and, in the backward, the thread's share of dw stay in its registers for the whole launch.
//     The forward takes K = kMaxChunks (fewer instructions per row, more blocks per multiprocessor), the
//     backward the fewest K that fit (its registers hold K vectors of dy, x, w and dw). Rows reach shared
//     memory through the bulk copy engine (cp.async.bulk, one copy per row and tensor, completing on an
//     mbarrier) into a ring of S stages (RowRing, bulk_ring.cuh), up to S - 1 rows ahead of the row being computed: the bytes in
//     flight do not depend on registers or on the warps being busy elsewhere. Per row, one
//     __syncthreads: the row reduction (warp shuffles, then one value per warp through a double-buffered
//     scratch), which also tells thread 0 that every thread has its values of the stage in registers, so
//     it refills that stage at once. Forward: block b handles the rows b * R, ..., b * R + R - 1
//     (R <= kFwdRowsPerBlock), so the block scheduler balances the multiprocessors to the end. Backward:
//     a persistent grid (what is resident at once, at most kMaxPartials blocks); block b handles rows b,
//     b + grid, ... (a fixed assignment: dw's partial sums must not depend on timing). These kernels and
//     the dw reduction are launched as programmatic dependent launches (each may be scheduled while the previous kernel in the stream drains, and waits for it
//     before touching global memory) and ask for the largest shared-memory carveout, so that
//     back-to-back launches do not reconfigure the multiprocessors.
//   looped (any n): a block per row, two passes over the row (the second re-reads from L1/L2), 16-byte
//     vectors when n % V == 0 and the pointers are aligned, scalar elements otherwise (odd n such as 4097,
//     or unaligned views). The backward accumulates dw directly in its block's partial row (each column
//     owned by one thread, so no races). Also the fallback on devices older than sm_90.
#include "kernels/rmsnorm.h"

#include <algorithm>
#include <climits>

#include "kernels/bulk_ring.cuh"
#include "kernels/common.cuh"
#include "kernels/launch_plan.h"

namespace ftd::kernels {
namespace {

using namespace detail;  // the device helpers of common.cuh (and bulk_ring.cuh)

constexpr int kPipeThreads = 512;      // pipelined path: most threads of a block
constexpr int kMaxChunks = 2;          // pipelined path: most 16-byte vectors a thread owns per row
constexpr int kMaxStages = 8;          // pipelined path: most rows (of each tensor) in shared memory per block
constexpr int kPipeSmemPerSm = 200 * 1024;  // pipelined path: stage bytes per multiprocessor (of 228 KB)
constexpr int64_t kFwdRowsPerBlock = 4;     // pipelined forward: most rows of one block
constexpr int kLoopThreads = 512;      // looped path: threads of a block (one row at a time)
constexpr int64_t kMaxPartials = 512;  // upper bound on backward blocks, hence on workspace rows

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
// Pipelined path. blockDim = (T); a ring of S stages (bulk_ring.cuh) holds the block's next rows: the x row
// (forward), or the dy row and the x row (backward).

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

// This thread's chunks of a row: chunk k is the row's chunk tid + k * nt, zeros past the end of the row.
template <typename T, int W, int K>
__device__ __forceinline__ void LoadRow(const T* row, int tid, int nt, int nc, Chunk<T, W> (&v)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = tid + k * nt;
    v[k] = c < nc ? LoadChunk<T, W>(row + static_cast<int64_t>(c) * W) : ZeroChunk<T, W>();
  }
}

// Writes this thread's chunks of a row (those inside it): element i of chunk k is value(k, i), rounded
// to T once.
template <typename T, int W, int K, typename F>
__device__ __forceinline__ void StoreRow(T* row, int tid, int nt, int nc, F&& value) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = tid + k * nt;
    if (c < nc) {
      Chunk<T, W> o;
#pragma unroll
      for (int i = 0; i < W; ++i) o.v[i] = FromFloat<T>(value(k, i));
      StoreChunk<T, W>(row + static_cast<int64_t>(c) * W, o);
    }
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
  RowRing<T, 1> ring(stage_mem, full, stages, n, {x});
  GridDependencyWait();
  if (tid == 0) ring.Start(first, step, count);
  float wf[K][W];
  LoadWeights<T, W, K>(w, nc, wf);
  __syncthreads();  // the barriers are initialised
  const float inv_n = 1.f / static_cast<float>(n);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j * step;
    const T* xs = ring.Row(0);
    ring.Wait();
    Chunk<T, W> xv[K];
    LoadRow<T, W, K>(xs, tid, nt, nc, xv);
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float f = ToFloat(xv[k].v[i]);
        ss += f * f;
      }
    }
    ss = PipeBlockSum(ss, scratch[j & 1]);
    // Every thread holds its values of the stage: refill it.
    if (tid == 0 && j + stages < count) ring.Refill(row + stages * step);
    const float r = rsqrtf(ss * inv_n + eps);
    if (tid == 0) rstd[row] = r;
    StoreRow<T, W, K>(y + row * n, tid, nt, nc, [&](int k, int i) { return ToFloat(xv[k].v[i]) * r * wf[k][i]; });
    ring.Next();
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
  RowRing<T, 2> ring(stage_mem, full, stages, n, {dy, x});
  GridDependencyWait();
  if (tid == 0) ring.Start(first, step, count);
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
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j * step;
    const float r = r_next;
    if (j + 1 < count) r_next = rstd[row + step];
    const T* dys = ring.Row(0);
    const T* xs = ring.Row(1);
    ring.Wait();
    Chunk<T, W> dyv[K], xv[K];
    LoadRow<T, W, K>(dys, tid, nt, nc, dyv);
    LoadRow<T, W, K>(xs, tid, nt, nc, xv);
    float dot = 0.f;  // sum of g * x over the row
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int i = 0; i < W; ++i) dot += ToFloat(dyv[k].v[i]) * wf[k][i] * ToFloat(xv[k].v[i]);
    }
    dot = PipeBlockSum(dot, scratch[j & 1]);
    // Every thread holds its values of the stage: refill it.
    if (tid == 0 && j + stages < count) ring.Refill(row + stages * step);
    const float mean_gxhat = dot * r * inv_n;  // mean(g * xhat)
    // dw's share of this thread accumulates as its chunks of dx are written.
    StoreRow<T, W, K>(dx + row * n, tid, nt, nc, [&](int k, int i) {
      const float d = ToFloat(dyv[k].v[i]);
      const float xh = ToFloat(xv[k].v[i]) * r;
      acc[k][i] += d * xh;
      return r * (d * wf[k][i] - xh * mean_gxhat);
    });
    ring.Next();
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
// Planning and launching.

constexpr RingBudget kRingBudget{kPipeSmemPerSm, kMaxStages};
constexpr int64_t kMaxGrid = INT_MAX;

// The pipelined path's block shape for rows of n elements (T threads owning K vectors each), or !ok
// when it does not apply to n (it also needs aligned pointers, checked per call). K = kMaxChunks (fewer
// threads, so fewer per-row instructions and more blocks per multiprocessor: the forward, whose
// registers allow it) or the fewest that fit (the backward, whose registers hold K vectors of dy, x, w
// and dw each).
struct PipeShape {
  bool ok = false;
  int threads = 0, chunks = 0;
};
template <typename T>
PipeShape PipeShapeFor(int64_t n, bool most_chunks) {
  constexpr int V = detail::kVec<T>;
  PipeShape s;
  if (n % V != 0 || n / V > static_cast<int64_t>(kPipeThreads) * kMaxChunks) return s;
  const int64_t nc = n / V;
  s.chunks = most_chunks ? kMaxChunks : static_cast<int>(CeilDiv(nc, kPipeThreads));
  s.threads = static_cast<int>(CeilDiv(CeilDiv(nc, s.chunks), 32) * 32);
  s.ok = true;
  return s;
}

int LoopThreads(int64_t chunks) { return static_cast<int>(std::min<int64_t>(kLoopThreads, CeilDiv(chunks, 32) * 32)); }

template <typename T>
const void* BwdPipeKernel(int chunks) {
  constexpr int V = detail::kVec<T>;
  return reinterpret_cast<const void*>(chunks == 1 ? RmsNormBwdPipe<T, V, 1> : RmsNormBwdPipe<T, V, 2>);
}

template <typename T>
void Plan(const DeviceProps& dev, int n, RmsNormPlan* plan) {
  constexpr int V = detail::kVec<T>;
  const int slot = static_cast<int>(RingSlotBytes(static_cast<uint32_t>(n) * sizeof(T)));
  if (const PipeShape f = PipeShapeFor<T>(n, /*most_chunks=*/true); f.ok) {
    plan->fwd_threads = f.threads;
    plan->fwd = PlanRing(dev, reinterpret_cast<const void*>(RmsNormFwdPipe<T, V, kMaxChunks>), f.threads, slot,
                         kRingBudget);
  }
  if (const PipeShape b = PipeShapeFor<T>(n, /*most_chunks=*/false); b.ok) {
    plan->bwd_threads = b.threads;
    plan->bwd_chunks = b.chunks;
    plan->bwd = PlanRing(dev, BwdPipeKernel<T>(b.chunks), b.threads, 2 * slot, kRingBudget);
  }
  if (n % V == 0) {
    plan->looped_bwd_resident_vec =
        ResidentBlocks(dev, reinterpret_cast<const void*>(RmsNormBwdLooped<T, V>), LoopThreads(n / V));
  }
  plan->looped_bwd_resident_scalar =
      ResidentBlocks(dev, reinterpret_cast<const void*>(RmsNormBwdLooped<T, 1>), LoopThreads(n));
  plan->pdl = dev.HasBulkCopy();
  if (plan->pdl) PreferMaxShared(reinterpret_cast<const void*>(RmsNormDwReduce<T>));
}

template <typename T>
cudaError_t Forward(const RmsNormPlan& plan, const T* x, const T* w, T* y, float* rstd, int64_t rows, float eps,
                    cudaStream_t stream) {
  constexpr int V = detail::kVec<T>;
  const int n = static_cast<int>(plan.n);
  const bool aligned = detail::Aligned16(x) && detail::Aligned16(w) && detail::Aligned16(y);
  if (aligned && plan.fwd.ok) {
    const RingPlan& p = plan.fwd;
    // A few consecutive rows per block, fewer when that leaves multiprocessors idle; the block scheduler
    // hands the next block to whichever multiprocessor frees a slot first, which balances the end.
    const int64_t per_block =
        std::max(std::clamp<int64_t>(CeilDiv(rows, p.resident), 1, kFwdRowsPerBlock), CeilDiv(rows, kMaxGrid));
    const int stages = static_cast<int>(std::min<int64_t>(p.stages, per_block));
    return LaunchPdl(true, RmsNormFwdPipe<T, V, kMaxChunks>, dim3(static_cast<unsigned>(CeilDiv(rows, per_block))),
                     dim3(plan.fwd_threads), static_cast<size_t>(stages) * p.stage_bytes, stream, x, w, y, rstd, rows,
                     n, eps, stages, per_block);
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
cudaError_t Backward(const RmsNormPlan& plan, const T* dy, const T* x, const T* w, const float* rstd, T* dx, T* dw,
                     float* partial, int64_t rows, cudaStream_t stream) {
  constexpr int V = detail::kVec<T>;
  const int n = static_cast<int>(plan.n);
  const bool aligned = detail::Aligned16(dy) && detail::Aligned16(x) && detail::Aligned16(w) && detail::Aligned16(dx);
  int64_t blocks = 0;
  if (rows > 0) {
    cudaError_t e = cudaSuccess;
    if (aligned && plan.bwd.ok) {
      const RingPlan& p = plan.bwd;
      auto* kernel = plan.bwd_chunks == 1 ? RmsNormBwdPipe<T, V, 1> : RmsNormBwdPipe<T, V, 2>;
      blocks = std::min({rows, p.resident, kMaxPartials});
      e = LaunchPdl(true, kernel, dim3(static_cast<unsigned>(blocks)), dim3(plan.bwd_threads), p.smem, stream, dy, x, w,
                    rstd, dx, partial, rows, n, p.stages);
    } else {
      const bool vec = aligned && n % V == 0;
      auto* kernel = vec ? RmsNormBwdLooped<T, V> : RmsNormBwdLooped<T, 1>;
      const int threads = LoopThreads(vec ? n / V : n);
      const int64_t resident = vec ? plan.looped_bwd_resident_vec : plan.looped_bwd_resident_scalar;
      blocks = std::min(BalancedGroups(rows, resident), kMaxPartials);
      kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(dy, x, w, rstd, dx, partial, rows, n);
      e = cudaGetLastError();
    }
    if (e != cudaSuccess) return e;
  }
  return LaunchPdl(plan.pdl, RmsNormDwReduce<T>, dim3(static_cast<unsigned>(CeilDiv(n, 32))), dim3(32, 32), 0, stream,
                   static_cast<const float*>(partial), blocks, n, dw);
}

bool SizesOk(int64_t rows, int64_t n) { return rows >= 0 && n >= 1 && n <= INT_MAX; }

// The plan is made and the device is current (its kernel attributes were set on that device only).
bool PlanUsable(const RmsNormPlan& plan) {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return SizesOk(0, plan.n) && device == plan.device;
}

}  // namespace

cudaError_t PlanRmsNorm(const DeviceProps& device, DType dtype, int64_t n, RmsNormPlan* plan) {
  if (plan == nullptr || !SizesOk(0, n)) return cudaErrorInvalidValue;
  int current = -1;
  if (const cudaError_t e = cudaGetDevice(&current); e != cudaSuccess) {
    cudaGetLastError();
    return e;
  }
  if (current != device.device) return cudaErrorInvalidDevice;
  *plan = RmsNormPlan{};
  plan->device = device.device;
  plan->dtype = dtype;
  plan->n = n;
  if (dtype == DType::kF32) {
    Plan<float>(device, static_cast<int>(n), plan);
  } else {
    Plan<__nv_bfloat16>(device, static_cast<int>(n), plan);
  }
  return cudaSuccess;
}

cudaError_t RmsNormForward(const RmsNormPlan& plan, const void* x, const void* w, void* y, float* rstd, int64_t rows,
                           float eps, cudaStream_t stream) {
  if (rows < 0 || x == nullptr || w == nullptr || y == nullptr || rstd == nullptr) return cudaErrorInvalidValue;
  if (!PlanUsable(plan)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (plan.dtype == DType::kF32) {
    return Forward(plan, static_cast<const float*>(x), static_cast<const float*>(w), static_cast<float*>(y), rstd, rows,
                   eps, stream);
  }
  return Forward(plan, static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
                 static_cast<__nv_bfloat16*>(y), rstd, rows, eps, stream);
}

size_t RmsNormBackwardWorkspaceBytes(int64_t rows, int64_t n) {
  if (!SizesOk(rows, n)) return 0;
  return static_cast<size_t>(std::min(rows, kMaxPartials)) * static_cast<size_t>(n) * sizeof(float);
}

cudaError_t RmsNormBackward(const RmsNormPlan& plan, const void* dy, const void* x, const void* w, const float* rstd,
                            void* dx, void* dw, void* workspace, int64_t rows, cudaStream_t stream) {
  if (rows < 0 || w == nullptr || dw == nullptr) return cudaErrorInvalidValue;
  if (rows > 0 && (dy == nullptr || x == nullptr || rstd == nullptr || dx == nullptr || workspace == nullptr ||
                   (reinterpret_cast<uintptr_t>(workspace) & 3u) != 0)) {
    return cudaErrorInvalidValue;
  }
  if (!PlanUsable(plan)) return cudaErrorInvalidValue;
  float* partial = static_cast<float*>(workspace);
  if (plan.dtype == DType::kF32) {
    return Backward(plan, static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(w),
                    rstd, static_cast<float*>(dx), static_cast<float*>(dw), partial, rows, stream);
  }
  return Backward(plan, static_cast<const __nv_bfloat16*>(dy), static_cast<const __nv_bfloat16*>(x),
                  static_cast<const __nv_bfloat16*>(w), rstd, static_cast<__nv_bfloat16*>(dx),
                  static_cast<__nv_bfloat16*>(dw), partial, rows, stream);
}

}  // namespace ftd::kernels
