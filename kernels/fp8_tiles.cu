// FP8 casts in 64x64 tiles: concatenated sources, row-major and transposed outputs in one launch; and
// the FP8 byte transpose.
//
// Why: cuBLASLt's FP8 GEMMs on Hopper take both operands K-major ("TN"), so the backward of y = x W^T
// needs W^T (for dx = dy W) and dy^T, x^T (for dW = dy^T x) as row-major FP8 copies. A generic strided
// copy of the bytes runs at a fraction of the memory bandwidth; these kernels stage each tile in
// shared memory and write both the tile and its transpose with coalesced stores.
//
//   Fp8CastTiles: S [R, C] = the sources concatenated along columns ([s0 | s1 | ...], each [R0, c_i])
//     or rows ([s0; s1; ...], each [r_i, C]); rows R0..R-1 zero (padding to a multiple of 16).
//     sources:   bf16 or fp32, row-major with a leading dimension; a null source reads as zeros
//     out:       (=) [R, C] fp8, row-major, or not written (nullptr)
//     out_t:     (=) [C, R] fp8, row-major (S^T), or not written (nullptr)
//     amax:      (=) kCompute: max |S| over the finite elements; kGiven: max over the sources' amax
//     scale_inv: (=) 1 / scale, scale = min(Fp8Max / amax, FLT_MAX) or 1 when amax is 0
//     Values: fp8(S * scale), the product in fp32, round to nearest even, saturating; NaN and +-Inf
//     become kFp8NaN (Fp8CastAmax's rules exactly, so given the scale the bytes are the reference's).
//     kCompute is two launches: the amax of the sources (grid stride, atomicMax), then the tiles, scaled
//     by it; kGiven is the tiles' launch alone.
//   Fp8Transpose: out [C, R] = in [R, C], bytes.
//
// Tiles: one a block, 256 threads; 64 x 64 elements for the casts, 64 x 128 bytes for the transpose; every
// load of a tile issued before its first cast. Loads: 16-byte vectors (8 bf16 / 4 fp32 / 16 fp8 elements)
// when every source pointer is 16-byte aligned and every leading dimension and source width is a
// multiple of the vector (a vector then never straddles two sources), else element by element with the
// source looked up per element. Row-major stores: the vector's bytes in one store when C is a multiple
// of the vector and out is 16-byte aligned. Transposed stores: four consecutive threads gather the 64
// bytes of one column of the shared tile (its rows a byte more than the tile's width apart, so the
// gathers hit distinct banks) and store them 16 bytes each when R is a multiple of 16 and out_t is
// 16-byte aligned; bytewise otherwise. Tiles at the right and bottom edges are bounds-checked.
#include <algorithm>
#include <cfloat>

#include "kernels/common.cuh"
#include "kernels/fp8_common.cuh"
#include "kernels/fp8_tiles.h"

namespace ftd::kernels {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kTileR = 64;  // rows of a tile; each block takes one tile

// A tile of kTileR rows and TC bytes held as 32-bit words, its rows TC + 4 bytes apart (an odd number of
// words, so that the words of one column in rows 4 apart spread over the banks).
template <int TC>
using Tile = uint32_t[kTileR][TC / 4 + 1];

// V bytes (V = 4, 8 or 16) into row r of the tile at byte column c (a multiple of V), as words.
template <int TC, int V>
__device__ __forceinline__ void PutBytes(Tile<TC>& tile, int r, int c, const uint8_t* b) {
#pragma unroll
  for (int w = 0; w < V / 4; ++w) {
    tile[r][c / 4 + w] = static_cast<uint32_t>(b[4 * w]) | static_cast<uint32_t>(b[4 * w + 1]) << 8 |
                         static_cast<uint32_t>(b[4 * w + 2]) << 16 | static_cast<uint32_t>(b[4 * w + 3]) << 24;
  }
}

// The sources as the kernel reads them: each source's offset along the concatenated dimension.
struct Layout {
  const void* ptr[kFp8MaxSources];
  int64_t rows[kFp8MaxSources], cols[kFp8MaxSources], ld[kFp8MaxSources], off[kFp8MaxSources];
  const float* amax[kFp8MaxSources];
  int n;
  bool by_cols;
  int64_t r0, R, C;  // rows with data, rows in all (padding included), columns
};

// The source holding S's element (r, c) (r < r0) and its local coordinates.
__device__ __forceinline__ int Find(const Layout& s, int64_t r, int64_t c, int64_t* lr, int64_t* lc) {
  const int64_t key = s.by_cols ? c : r;
  int i = 0;
  while (i + 1 < s.n && s.off[i + 1] <= key) ++i;
  *lr = s.by_cols ? r : r - s.off[i];
  *lc = s.by_cols ? c - s.off[i] : c;
  return i;
}

template <typename T>
__device__ __forceinline__ T Element(const Layout& s, int64_t r, int64_t c) {
  if (r >= s.r0 || c >= s.C) return T(0.f);
  int64_t lr, lc;
  const int i = Find(s, r, c, &lr, &lc);
  const T* p = static_cast<const T*>(s.ptr[i]);
  return p == nullptr ? T(0.f) : p[lr * s.ld[i] + lc];
}

// S[r, c .. c + V), V = 16 / sizeof(T), as stored (zeros past the data).
template <typename T>
__device__ __forceinline__ Vec<T> Chunk(const Layout& s, bool vec, int64_t r, int64_t c) {
  Vec<T> v;
  if (vec) {
    int64_t lr, lc;
    const int i = r < s.r0 ? Find(s, r, c, &lr, &lc) : 0;
    const T* p = static_cast<const T*>(s.ptr[i]);
    if (r < s.r0 && p != nullptr) return LoadVec(p + lr * s.ld[i] + lc);
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) v.v[j] = T(0.f);
    return v;
  }
#pragma unroll
  for (int j = 0; j < kVec<T>; ++j) v.v[j] = Element<T>(s, r, c + j);
  return v;
}

// Writes the shared tile at (tr, tc) to out_t ([C, R]). A thread takes 4 rows x 4 columns: four word
// loads, a 4 x 4 byte transpose in registers (__byte_perm), and four 4-byte stores, one into each of
// the 4 output rows; the 16 threads of a half-warp take the 16 row groups of one word column, so each
// output row's 64 bytes are written by consecutive threads.
template <int TC>
__device__ __forceinline__ void StoreTransposed(const Tile<TC>& tile, int64_t tr, int64_t tc, int64_t R, int64_t C,
                                               bool vec, uint8_t* out_t) {
  constexpr int kGroups = kTileR / 4;  // row groups of 4
#pragma unroll
  for (int k = 0; k < kGroups * (TC / 4) / kThreads; ++k) {
    const int id = threadIdx.x + k * kThreads;
    const int rg = id % kGroups, cw = id / kGroups;
    const int64_t gr = tr * kTileR + 4 * rg, gc = tc * TC + 4 * cw;
    if (gc >= C || gr >= R) continue;
    const uint32_t a0 = tile[4 * rg][cw], a1 = tile[4 * rg + 1][cw], a2 = tile[4 * rg + 2][cw],
                   a3 = tile[4 * rg + 3][cw];
    const uint32_t t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a0, a1, 0x7362);
    const uint32_t t2 = __byte_perm(a2, a3, 0x5140), t3 = __byte_perm(a2, a3, 0x7362);
    const uint32_t col[4] = {__byte_perm(t0, t2, 0x5410), __byte_perm(t0, t2, 0x7632), __byte_perm(t1, t3, 0x5410),
                             __byte_perm(t1, t3, 0x7632)};  // col[j]: rows gr..gr+3 of column gc + j
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (gc + j >= C) break;
      uint8_t* dst = out_t + (gc + j) * R + gr;
      if (vec && gr + 4 <= R) {
        *reinterpret_cast<uint32_t*>(dst) = col[j];
      } else {
        for (int q = 0; q < 4 && gr + q < R; ++q) dst[q] = static_cast<uint8_t>(col[j] >> (8 * q));
      }
    }
  }
}

struct Vectors {
  bool load, out, out_t;  // 16-byte loads, V-byte row-major stores, 16-byte transposed stores
};

// amax (+=, atomicMax on the fp32 bits; zeroed before): max |x| over the finite elements of the sources,
// by grid stride, 16-byte vectors on contiguous sources, four in flight.
template <typename T>
__global__ void __launch_bounds__(kThreads) SourcesAmaxKernel(Layout s, bool vec, float* amax) {
  constexpr int V = kVec<T>;
  __shared__ float scratch[32];
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  float m = 0.f;
  for (int i = 0; i < s.n; ++i) {
    const T* p = static_cast<const T*>(s.ptr[i]);
    if (p == nullptr) continue;
    if (vec && s.ld[i] == s.cols[i]) {
      const int64_t nv = s.rows[i] * s.cols[i] / V;
      int64_t v = tid;
      for (; v + 3 * stride < nv; v += 4 * stride) {
        Vec<T> x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) x[u] = LoadVec(p + (v + u * stride) * V);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int j = 0; j < V; ++j) m = AbsMaxFinite(m, ToFloat(x[u].v[j]));
        }
      }
      for (; v < nv; v += stride) {
        const Vec<T> x = LoadVec(p + v * V);
#pragma unroll
        for (int j = 0; j < V; ++j) m = AbsMaxFinite(m, ToFloat(x.v[j]));
      }
    } else {
      const int64_t n = s.rows[i] * s.cols[i];
      for (int64_t e = tid; e < n; e += stride) m = AbsMaxFinite(m, ToFloat(p[(e / s.cols[i]) * s.ld[i] + e % s.cols[i]]));
    }
  }
  m = BlockMax(m, scratch);
  if (threadIdx.x == 0 && m > 0.f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

// One 64 x 64 tile of S a block: the scale from the largest of the sources' amax values (amax_out (=) that
// value, unless null), the tile's loads all issued before the first cast, the row-major bytes stored
// directly and the transposed ones through the shared tile.
template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    Fp8TilesKernel(Layout s, Vectors vec, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* amax_out,
                   float* scale_inv) {
  constexpr int TC = 64;
  constexpr int V = kVec<T>;
  constexpr int kChunksPerRow = TC / V;
  constexpr int kPerThread = kTileR * kChunksPerRow / kThreads;
  __shared__ Tile<TC> tile;
  const int64_t tiles_c = std::max<int64_t>(1, CeilDiv(s.C, TC));
  const int64_t tr = blockIdx.x / tiles_c, tc = blockIdx.x % tiles_c;
  Vec<T> x[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int id = threadIdx.x + k * kThreads;
    const int64_t r = tr * kTileR + id / kChunksPerRow, c = tc * TC + (id % kChunksPerRow) * V;
    if (r < s.R && c < s.C) x[k] = Chunk<T>(s, vec.load, r, c);
  }
  float a = 0.f;
  for (int i = 0; i < s.n; ++i) a = fmaxf(a, __ldg(s.amax[i]));
  const float scale = ScaleOf<F>(a);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (amax_out != nullptr) *amax_out = a;
    *scale_inv = __fdiv_rn(1.f, scale);
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int id = threadIdx.x + k * kThreads;
    const int lr = id / kChunksPerRow, lc = (id % kChunksPerRow) * V;
    const int64_t r = tr * kTileR + lr, c = tc * TC + lc;
    if (r >= s.R || c >= s.C) continue;
    Bytes<V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.b[j] = ToFp8<F>(__fmul_rn(ToFloat(x[k].v[j]), scale));
    if (out != nullptr) {
      uint8_t* dst = out + r * s.C + c;
      if (vec.out) {
        *reinterpret_cast<Bytes<V>*>(dst) = o;
      } else {
        for (int j = 0; j < V && c + j < s.C; ++j) dst[j] = o.b[j];
      }
    }
    PutBytes<TC, V>(tile, lr, lc, o.b);
  }
  if (out_t != nullptr) {
    __syncthreads();
    StoreTransposed<TC>(tile, tr, tc, s.R, s.C, vec.out_t, out_t);
  }
}

// One 64 x 128 tile of bytes a block.
__global__ void __launch_bounds__(kThreads)
    TransposeKernel(const uint8_t* __restrict__ in, int64_t R, int64_t C, bool vec_in, bool vec_out,
                    uint8_t* __restrict__ out) {
  constexpr int TC = 128;
  constexpr int kChunksPerRow = TC / 16;
  constexpr int kPerThread = kTileR * kChunksPerRow / kThreads;
  __shared__ Tile<TC> tile;
  const int64_t tiles_c = CeilDiv(C, TC);
  const int64_t tr = blockIdx.x / tiles_c, tc = blockIdx.x % tiles_c;
  alignas(16) uint8_t b[kPerThread][16];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int id = threadIdx.x + k * kThreads;
    const int64_t r = tr * kTileR + id / kChunksPerRow, c = tc * TC + (id % kChunksPerRow) * 16;
    if (r >= R || c >= C) continue;
    if (vec_in) {
      *reinterpret_cast<uint4*>(b[k]) = *reinterpret_cast<const uint4*>(in + r * C + c);
    } else {
      for (int j = 0; j < 16 && c + j < C; ++j) b[k][j] = in[r * C + c + j];
    }
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int id = threadIdx.x + k * kThreads;
    const int lr = id / kChunksPerRow, lc = (id % kChunksPerRow) * 16;
    PutBytes<TC, 16>(tile, lr, lc, b[k]);
  }
  __syncthreads();
  StoreTransposed<TC>(tile, tr, tc, R, C, vec_out, out);
}

template <typename T, Fp8Format F>
cudaError_t Launch(const DeviceProps& props, Layout s, Vectors vec, const Fp8TileCast& p, cudaStream_t stream) {
  float* amax_out = p.amax;
  if (p.scale_from == Fp8ScaleFrom::kCompute) {
    // The amax first (its own launch), then the tiles scaled by it.
    if (const cudaError_t e = cudaMemsetAsync(p.amax, 0, sizeof(float), stream); e != cudaSuccess) return e;
    const int64_t n = s.r0 * s.C;
    const int64_t blocks = std::clamp<int64_t>(CeilDiv(n, kThreads * kVec<T> * 4), 1,
                                               4 * ResidentBlocks(props, reinterpret_cast<const void*>(SourcesAmaxKernel<T>), kThreads));
    SourcesAmaxKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(s, vec.load, p.amax);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    for (int i = 0; i < s.n; ++i) s.amax[i] = p.amax;
    amax_out = nullptr;
  }
  // At least one block: with nothing to cast it still writes the scale.
  const int64_t tiles = std::max<int64_t>(1, CeilDiv(s.R, kTileR) * CeilDiv(s.C, 64));
  Fp8TilesKernel<T, F><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(s, vec, p.out, p.out_t, amax_out,
                                                                              p.scale_inv);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Dispatch(const DeviceProps& props, const Layout& s, Vectors vec, const Fp8TileCast& p,
                     cudaStream_t stream) {
  return p.format == Fp8Format::kE4M3 ? Launch<T, Fp8Format::kE4M3>(props, s, vec, p, stream)
                                      : Launch<T, Fp8Format::kE5M2>(props, s, vec, p, stream);
}

}  // namespace

cudaError_t Fp8CastTiles(const DeviceProps& props, const Fp8TileCast& p, cudaStream_t stream) {
  if (p.num_sources < 1 || p.num_sources > kFp8MaxSources || p.amax == nullptr || p.scale_inv == nullptr ||
      (p.out == nullptr && p.out_t == nullptr) || (p.dtype != DType::kBF16 && p.dtype != DType::kF32)) {
    return cudaErrorInvalidValue;
  }
  Layout s = {};
  s.n = p.num_sources;
  s.by_cols = p.concat == Fp8Concat::kCols;
  const int V = p.dtype == DType::kF32 ? 4 : 8;
  bool vec_load = true;
  int64_t along = 0;
  for (int i = 0; i < s.n; ++i) {
    const Fp8Source& src = p.sources[i];
    if (src.rows < 0 || src.cols < 0 || src.ld < src.cols) return cudaErrorInvalidValue;
    if (p.scale_from == Fp8ScaleFrom::kGiven && src.amax == nullptr) return cudaErrorInvalidValue;
    const Fp8Source& first = p.sources[0];
    if (s.by_cols ? src.rows != first.rows : src.cols != first.cols) return cudaErrorInvalidValue;
    s.ptr[i] = src.ptr;
    s.rows[i] = src.rows;
    s.cols[i] = src.cols;
    s.ld[i] = src.ld;
    s.amax[i] = src.amax;
    s.off[i] = along;
    along += s.by_cols ? src.cols : src.rows;
    vec_load = vec_load && (src.ptr == nullptr || Aligned16(src.ptr)) && src.ld % V == 0 && src.cols % V == 0;
  }
  s.r0 = s.by_cols ? p.sources[0].rows : along;
  s.C = s.by_cols ? along : p.sources[0].cols;
  s.R = p.rows_out == 0 ? s.r0 : p.rows_out;
  if (s.R < s.r0) return cudaErrorInvalidValue;
  const Vectors vec{vec_load, s.C % V == 0 && (p.out == nullptr || Aligned16(p.out)),
                    s.R % 16 == 0 && (p.out_t == nullptr || Aligned16(p.out_t))};
  return p.dtype == DType::kF32 ? Dispatch<float>(props, s, vec, p, stream)
                                : Dispatch<__nv_bfloat16>(props, s, vec, p, stream);
}

cudaError_t Fp8Transpose(const DeviceProps& props, const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out,
                         cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr) return cudaErrorInvalidValue;
  const int64_t tiles = CeilDiv(rows, kTileR) * CeilDiv(cols, 128);
  TransposeKernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
      in, rows, cols, cols % 16 == 0 && Aligned16(in), rows % 16 == 0 && Aligned16(out), out);
  return cudaGetLastError();
}

}  // namespace ftd::kernels
