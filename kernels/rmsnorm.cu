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
// accumulates their dy * xhat in registers (per thread: fixed columns), combines its row groups in a fixed
// order, and writes one partial row; a second kernel sums the P partial rows of each column in a fixed
// order. Same inputs on the same device give bitwise the same dw.
//
// Paths (picked per call; every one is exercised by rmsnorm_test.cc):
//   cached (fast): n % V == 0 (V = 16 / sizeof(dtype): 8 bf16, 4 fp32), the base pointers 16-byte aligned
//     (so every row is), and n / V <= kChunksPerThread * kMaxGroupThreads (n <= 8192 bf16, 4096 fp32).
//     A "row group" of G threads (a multiple of 32, G * kChunksPerThread >= n / V) holds one row in
//     registers as 16-byte vectors, loaded once; a block holds R row groups (G * R <= 512), each
//     synchronised by its own named barrier, so a block works on R rows at once. w is widened to fp32 in
//     shared memory once per block. Both directions run a persistent grid sized to what is resident on
//     the device at once, each group looping over rows; the backward keeps each thread's share of dw in
//     registers across its rows, so dw needs only one partial row per block.
//   looped (any n): a block per row, two passes over the row (the second re-reads from L1/L2), 16-byte
//     vectors when n % V == 0 and the pointers are aligned, scalar elements otherwise (odd n such as 4097,
//     or unaligned views). The backward accumulates dw directly in its block's partial row (each column
//     owned by one thread, so no races).
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

constexpr int kChunksPerThread = 2;    // cached path: 16-byte vectors per thread per row (in registers)
constexpr int kMaxGroupThreads = 512;  // cached path: threads of one row group
constexpr int kBlockThreads = 512;     // cached path: threads of a block (row groups * group threads)
constexpr int kMaxGroups = 8;          // row groups per block (named barriers 1..8; 0 is __syncthreads)
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

// A chunk of zeros: the value of a chunk past the end of the row (never stored; keeps the loads below
// free of loop-carried register state).
template <typename T, int W>
__device__ __forceinline__ Chunk<T, W> ZeroChunk() {
  Chunk<T, W> c;
#pragma unroll
  for (int j = 0; j < W; ++j) c.v[j] = FromFloat<T>(0.f);
  return c;
}

// Asks L2 to fetch the 128-byte line holding p (a hint: no register, no wait). The cached kernels issue
// it for the next row a group will handle, so that row's loads find it in L2 (more bytes in flight per
// multiprocessor than the registers alone hold). Set to false to compare.
constexpr bool kPrefetchNextRow = true;
__device__ __forceinline__ void PrefetchL2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Barrier over the `nthreads` threads (whole warps) of one row group; id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void GroupBarrier(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

// Sum over the row group of blockDim.x threads (threadIdx.y selects the group); every thread of the group
// gets the same value. `scratch` is this group's kMaxGroupThreads / 32 floats of shared memory.
__device__ __forceinline__ float GroupSum(float v, float* scratch) {
  v = WarpSum(v);  // butterfly: bitwise the same value in every lane
  const int nwarps = blockDim.x >> 5;
  if (nwarps == 1) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, id = 1 + threadIdx.y;
  GroupBarrier(id, blockDim.x);  // the previous call's reads of scratch are done
  if (lane == 0) scratch[warp] = v;
  GroupBarrier(id, blockDim.x);
  float s = 0.f;
  for (int i = 0; i < nwarps; ++i) s += scratch[i];  // same order in every thread
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Cached path. blockDim = (G, R): group threadIdx.y handles rows blockIdx.x * R + y, + gridDim.x * R, ...
// (a persistent grid). Thread x of a group owns the vectors x, x + G, ..., x + (K - 1) * G of every row it
// handles, so its share of dw stays in its registers across rows. w is widened to fp32 once per block into
// shared memory (registers are what limits how many rows are in flight per multiprocessor).

// Widens w (n elements) into shared memory; every thread of the block calls it.
template <typename T>
__device__ __forceinline__ void StageWeights(const T* w, int n, float* wsm) {
  const int nt = blockDim.x * blockDim.y;
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < n; i += nt) wsm[i] = ToFloat(w[i]);
  __syncthreads();
}

// W fp32 values from 16-byte aligned shared memory (W is a multiple of 4 on the cached path).
template <int W>
__device__ __forceinline__ void LoadShared(const float* p, float (&out)[W]) {
  static_assert(W % 4 == 0);
#pragma unroll
  for (int q = 0; q < W / 4; ++q) {
    const float4 v = reinterpret_cast<const float4*>(p)[q];
    out[4 * q] = v.x;
    out[4 * q + 1] = v.y;
    out[4 * q + 2] = v.z;
    out[4 * q + 3] = v.w;
  }
}

template <typename T, int W, int K>
__global__ void __launch_bounds__(kBlockThreads, 3)
    RmsNormFwdCached(const T* x, const T* w, T* y, float* rstd, int64_t rows, int n, float eps) {
  __shared__ alignas(16) float wsm[K * W * kMaxGroupThreads];
  __shared__ float scratch[kMaxGroups][kMaxGroupThreads / 32];
  StageWeights(w, n, wsm);
  const int G = blockDim.x, tx = threadIdx.x, nc = n / W;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < rows;
       row += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    Chunk<T, W> xv[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tx + k * G;
      xv[k] = c < nc ? LoadChunk<T, W>(xr + static_cast<int64_t>(c) * W) : ZeroChunk<T, W>();
    }
    if (kPrefetchNextRow && row + static_cast<int64_t>(gridDim.x) * blockDim.y < rows) {
      const T* next = xr + static_cast<int64_t>(gridDim.x) * blockDim.y * n;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int c = tx + k * G;
        if (c < nc) PrefetchL2(next + static_cast<int64_t>(c) * W);
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (tx + k * G < nc) {
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float f = ToFloat(xv[k].v[j]);
          ss += f * f;
        }
      }
    }
    ss = GroupSum(ss, scratch[threadIdx.y]);
    const float r = rsqrtf(ss / static_cast<float>(n) + eps);
    if (tx == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tx + k * G;
      if (c < nc) {
        float wf[W];
        LoadShared<W>(wsm + c * W, wf);
        Chunk<T, W> o;
#pragma unroll
        for (int j = 0; j < W; ++j) o.v[j] = FromFloat<T>(ToFloat(xv[k].v[j]) * r * wf[j]);
        StoreChunk<T, W>(yr + static_cast<int64_t>(c) * W, o);
      }
    }
  }
}

template <typename T, int W, int K>
__global__ void __launch_bounds__(kBlockThreads, 2)
    RmsNormBwdCached(const T* dy, const T* x, const T* w, const float* rstd, T* dx, float* partial, int64_t rows,
                     int n) {
  // w as fp32; after the row loop the same memory exchanges dw between row groups (R > 1 only when
  // G <= kBlockThreads / 2, so the exchange needs W * kBlockThreads / 2 <= K * W * kMaxGroupThreads floats).
  __shared__ alignas(16) float wsm[K * W * kMaxGroupThreads];
  __shared__ float scratch[kMaxGroups][kMaxGroupThreads / 32];
  static_assert(W * kBlockThreads / 2 <= K * W * kMaxGroupThreads);
  StageWeights(w, n, wsm);
  const int G = blockDim.x, R = blockDim.y, tx = threadIdx.x, ty = threadIdx.y, nc = n / W;
  float acc[K][W];
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int j = 0; j < W; ++j) acc[k][j] = 0.f;
  }
  const float inv_n = 1.f / static_cast<float>(n);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * R + ty; row < rows;
       row += static_cast<int64_t>(gridDim.x) * R) {
    const T* dyr = dy + row * n;
    const T* xr = x + row * n;
    T* dxr = dx + row * n;
    Chunk<T, W> dyv[K], xv[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tx + k * G;
      dyv[k] = c < nc ? LoadChunk<T, W>(dyr + static_cast<int64_t>(c) * W) : ZeroChunk<T, W>();
      xv[k] = c < nc ? LoadChunk<T, W>(xr + static_cast<int64_t>(c) * W) : ZeroChunk<T, W>();
    }
    if (kPrefetchNextRow && row + static_cast<int64_t>(gridDim.x) * R < rows) {
      const int64_t step = static_cast<int64_t>(gridDim.x) * R * n;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int c = tx + k * G;
        if (c < nc) {
          PrefetchL2(dyr + step + static_cast<int64_t>(c) * W);
          PrefetchL2(xr + step + static_cast<int64_t>(c) * W);
        }
      }
    }
    const float r = rstd[row];
    float dot = 0.f;  // sum of g * x over the row
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tx + k * G;
      if (c < nc) {
        float wf[W];
        LoadShared<W>(wsm + c * W, wf);
#pragma unroll
        for (int j = 0; j < W; ++j) dot += ToFloat(dyv[k].v[j]) * wf[j] * ToFloat(xv[k].v[j]);
      }
    }
    dot = GroupSum(dot, scratch[ty]);
    const float mean_gxhat = dot * r * inv_n;  // mean(g * xhat)
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tx + k * G;
      if (c < nc) {
        float wf[W];
        LoadShared<W>(wsm + c * W, wf);
        Chunk<T, W> o;
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float d = ToFloat(dyv[k].v[j]);
          const float xh = ToFloat(xv[k].v[j]) * r;
          o.v[j] = FromFloat<T>(r * (d * wf[j] - xh * mean_gxhat));
          acc[k][j] += d * xh;
        }
        StoreChunk<T, W>(dxr + static_cast<int64_t>(c) * W, o);
      }
    }
  }
  // Combine the R groups into group 0, in the order 1, 2, ..., R - 1 (every thread reaches this point;
  // the first barrier also ends every group's reads of w, whose memory is reused here).
  float* xchg = wsm;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    for (int src = 1; src < R; ++src) {
      __syncthreads();
      if (ty == src) {
#pragma unroll
        for (int j = 0; j < W; ++j) xchg[j * G + tx] = acc[k][j];
      }
      __syncthreads();
      if (ty == 0) {
#pragma unroll
        for (int j = 0; j < W; ++j) acc[k][j] += xchg[j * G + tx];
      }
    }
  }
  if (ty == 0) {
    float* pr = partial + static_cast<int64_t>(blockIdx.x) * n;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tx + k * G;
      if (c < nc) {
#pragma unroll
        for (int j = 0; j < W; ++j) pr[static_cast<int64_t>(c) * W + j] = acc[k][j];
      }
    }
  }
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
// strided subset of the partial rows; the 32 subtotals are then added in order of y. P == 0 gives 0.
template <typename T>
__global__ void __launch_bounds__(1024) RmsNormDwReduce(const float* partial, int64_t P, int n, T* dw) {
  __shared__ float sub[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (c < n) {
#pragma unroll 4
    for (int64_t p = threadIdx.y; p < P; p += 32) s += partial[p * n + c];
  }
  sub[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    float t = 0.f;
    for (int i = 0; i < 32; ++i) t += sub[i][threadIdx.x];
    dw[c] = FromFloat<T>(t);
  }
}

// ---------------------------------------------------------------------------------------------------
// Launch helpers.

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
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess) {
    cudaGetLastError();  // clear; the launch reports any real problem
    return 1;
  }
  const int blocks = std::max(1, sms * std::max(per_sm, 1));
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

struct CachedShape {
  bool ok = false;
  int group_threads = 0, groups = 0;
};
// The cached path's block shape for rows of n elements, or !ok when it does not apply.
template <typename T>
CachedShape CachedShapeFor(int64_t n, bool aligned) {
  constexpr int V = detail::kVec<T>;
  CachedShape s;
  if (!aligned || n % V != 0 || n / V > static_cast<int64_t>(kChunksPerThread) * kMaxGroupThreads) return s;
  const int nc = static_cast<int>(n / V);
  s.group_threads = static_cast<int>(CeilDiv(CeilDiv(nc, kChunksPerThread), 32) * 32);
  s.groups = std::min(kMaxGroups, kBlockThreads / s.group_threads);
  s.ok = true;
  return s;
}

int LoopThreads(int64_t chunks) { return static_cast<int>(std::min<int64_t>(kLoopThreads, CeilDiv(chunks, 32) * 32)); }

constexpr int64_t kMaxGrid = INT_MAX;

template <typename T>
cudaError_t Forward(const T* x, const T* w, T* y, float* rstd, int64_t rows, int n, float eps, cudaStream_t stream) {
  constexpr int V = detail::kVec<T>;
  const bool aligned = detail::Aligned16(x) && detail::Aligned16(w) && detail::Aligned16(y);
  const CachedShape s = CachedShapeFor<T>(n, aligned);
  if (s.ok) {
    auto* kernel = RmsNormFwdCached<T, V, kChunksPerThread>;
    const int64_t cap =
        static_cast<int64_t>(ResidentBlocks(reinterpret_cast<const void*>(kernel), s.group_threads * s.groups)) *
        s.groups;
    const int64_t grid = CeilDiv(BalancedGroups(rows, cap), s.groups);
    kernel<<<static_cast<unsigned>(grid), dim3(s.group_threads, s.groups), 0, stream>>>(x, w, y, rstd, rows, n, eps);
  } else if (aligned && n % V == 0) {
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
  const CachedShape s = CachedShapeFor<T>(n, aligned);
  int64_t blocks = 0;
  if (rows > 0) {
    if (s.ok) {
      auto* kernel = RmsNormBwdCached<T, V, kChunksPerThread>;
      const int threads = s.group_threads * s.groups;
      const int64_t groups = BalancedGroups(
          rows, static_cast<int64_t>(ResidentBlocks(reinterpret_cast<const void*>(kernel), threads)) * s.groups);
      blocks = std::min(CeilDiv(groups, s.groups), kMaxPartials);
      kernel<<<static_cast<unsigned>(blocks), dim3(s.group_threads, s.groups), 0, stream>>>(dy, x, w, rstd, dx, partial,
                                                                                            rows, n);
    } else {
      const bool vec = aligned && n % V == 0;
      auto* kernel = vec ? RmsNormBwdLooped<T, V> : RmsNormBwdLooped<T, 1>;
      const int threads = LoopThreads(vec ? n / V : n);
      blocks =
          std::min(BalancedGroups(rows, ResidentBlocks(reinterpret_cast<const void*>(kernel), threads)), kMaxPartials);
      kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(dy, x, w, rstd, dx, partial, rows, n);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  RmsNormDwReduce<T><<<static_cast<unsigned>(CeilDiv(n, 32)), dim3(32, 32), 0, stream>>>(partial, blocks, n, dw);
  return cudaGetLastError();
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
