// SwiGLU (the LLaMA MLP's gate), elementwise over n elements of any shape, forward and backward fused:
// each input read once, each output written once.
//
// Forward (SwiGluForward):
//   gate, up: (n) dtype                 (read)
//   out:      (n) dtype                 (=)  out = silu(gate) * up = gate * s * up, s = sigmoid(gate)
// Backward (SwiGluBackward):
//   dout, gate, up: (n) dtype           (read)
//   dgate:    (n) dtype                 (=)  dgate = dout * up * s * (1 + gate * (1 - s))
//   dup:      (n) dtype                 (=)  dup = dout * gate * s
// dtype: kF32 or kBF16 storage; arithmetic in fp32 (expf and IEEE division, not the fast intrinsics), each
// output rounded once. fp32 outputs match a float64 reference to ~1e-6 relative; bf16 to 2^-9.
//
// In place: an output may be the same pointer as an input (out = gate or up; dgate = gate, dup = up,
// either = dout): every element is read and written by one thread, reads first. Outputs must not overlap
// each other and buffers must not partially overlap.
//
// Paths: vector when every pointer is 16-byte aligned: each thread moves kUnroll 16-byte vectors per
// input (8 bf16 / 4 fp32 elements each), all loads issued before the first use; the n % V tail elements
// (V = elements per vector) are done one by one by the first threads of block 0. Scalar otherwise (an
// unaligned view): one element per thread. Both are exercised by swiglu_test.cc.
//
// Rows (SwiGluForwardRows, SwiGluBackwardRows): the same math over rows x cols elements whose rows are
// strided (a fused gate|up GEMM output read in place, its gradient written in place): one V-element
// chunk per thread in a grid-stride loop (row and column from the chunk index), vector loads when every
// base pointer is 16-byte aligned and cols and the leading dimensions are multiples of V, else V = 1.
#include <algorithm>
#include <climits>
#include <initializer_list>

#include "kernels/common.cuh"
#include "kernels/swiglu.h"

namespace ftd::kernels {
namespace {

using namespace detail;  // the device helpers of common.cuh

constexpr int kThreads = 256;
constexpr int kUnroll = 2;  // 16-byte vectors per thread per input

__device__ __forceinline__ float Sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

__device__ __forceinline__ float FwdMath(float g, float u) { return g * Sigmoid(g) * u; }
__device__ __forceinline__ void BwdMath(float d, float g, float u, float& dg, float& du) {
  const float s = Sigmoid(g);
  dg = d * u * s * (1.f + g * (1.f - s));
  du = d * g * s;
}

template <typename T>
__device__ __forceinline__ Vec<T> ZeroVec() {
  Vec<T> v;
#pragma unroll
  for (int j = 0; j < kVec<T>; ++j) v.v[j] = FromFloat<T>(0.f);
  return v;
}

// The math of one element, in fp32: kIn inputs to kOut outputs.
struct FwdOp {  // (gate, up) -> out
  static constexpr int kIn = 2, kOut = 1;
  __device__ __forceinline__ void operator()(const float (&x)[kIn], float (&y)[kOut]) const {
    y[0] = FwdMath(x[0], x[1]);
  }
};
struct BwdOp {  // (dout, gate, up) -> (dgate, dup)
  static constexpr int kIn = 3, kOut = 2;
  __device__ __forceinline__ void operator()(const float (&x)[kIn], float (&y)[kOut]) const {
    BwdMath(x[0], x[1], x[2], y[0], y[1]);
  }
};

// A kernel argument: N pointers.
template <typename P, int N>
struct Ptrs {
  P* p[N];
};

// Element e of every input through Op to element e of every output (reads first: outputs may alias inputs).
template <typename T, typename Op>
__device__ __forceinline__ void ApplyOne(const Ptrs<const T, Op::kIn>& in, const Ptrs<T, Op::kOut>& out, int64_t e) {
  float x[Op::kIn], y[Op::kOut];
#pragma unroll
  for (int a = 0; a < Op::kIn; ++a) x[a] = ToFloat(in.p[a][e]);
  Op()(x, y);
#pragma unroll
  for (int b = 0; b < Op::kOut; ++b) out.p[b][e] = FromFloat<T>(y[b]);
}

// Vector path over vectors [0, nvec); the tail elements [nvec * V, n) (fewer than V) are done by the first
// threads of block 0, one element each.
template <typename T, typename Op>
__global__ void __launch_bounds__(kThreads)
    SwiGluVec(Ptrs<const T, Op::kIn> in, Ptrs<T, Op::kOut> out, int64_t nvec, int64_t n) {
  constexpr int V = kVec<T>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  Vec<T> x[kUnroll][Op::kIn];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = base + k * kThreads;
#pragma unroll
    for (int a = 0; a < Op::kIn; ++a) x[k][a] = i < nvec ? LoadVec(in.p[a] + i * V) : ZeroVec<T>();
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int64_t i = base + k * kThreads;
    if (i < nvec) {
      Vec<T> o[Op::kOut];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float xs[Op::kIn], ys[Op::kOut];
#pragma unroll
        for (int a = 0; a < Op::kIn; ++a) xs[a] = ToFloat(x[k][a].v[j]);
        Op()(xs, ys);
#pragma unroll
        for (int b = 0; b < Op::kOut; ++b) o[b].v[j] = FromFloat<T>(ys[b]);
      }
#pragma unroll
      for (int b = 0; b < Op::kOut; ++b) StoreVec(out.p[b] + i * V, o[b]);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < n - nvec * V) ApplyOne<T, Op>(in, out, nvec * V + threadIdx.x);
}

// Scalar path (an unaligned view): one element per thread, grid-stride.
template <typename T, typename Op>
__global__ void __launch_bounds__(kThreads) SwiGluScalar(Ptrs<const T, Op::kIn> in, Ptrs<T, Op::kOut> out, int64_t n) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    ApplyOne<T, Op>(in, out, e);
  }
}

unsigned VecGrid(int64_t nvec) {
  return static_cast<unsigned>(std::max<int64_t>(1, CeilDiv(nvec, kThreads * kUnroll)));
}
unsigned ScalarGrid(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(CeilDiv(n, kThreads), INT_MAX)); }

// Vector path when every pointer is 16-byte aligned (and the grid fits), else scalar.
template <typename T, typename Op>
cudaError_t Launch(Ptrs<const T, Op::kIn> in, Ptrs<T, Op::kOut> out, int64_t n, cudaStream_t stream) {
  const int64_t nvec = n / kVec<T>;
  bool aligned = CeilDiv(nvec, kThreads * kUnroll) <= INT_MAX;
  for (const T* p : in.p) aligned = aligned && detail::Aligned16(p);
  for (const T* p : out.p) aligned = aligned && detail::Aligned16(p);
  if (aligned) {
    SwiGluVec<T, Op><<<VecGrid(nvec), kThreads, 0, stream>>>(in, out, nvec, n);
  } else {
    SwiGluScalar<T, Op><<<ScalarGrid(n), kThreads, 0, stream>>>(in, out, n);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t Forward(const T* gate, const T* up, T* out, int64_t n, cudaStream_t stream) {
  return Launch<T, FwdOp>({{gate, up}}, {{out}}, n, stream);
}

template <typename T>
cudaError_t Backward(const T* dout, const T* gate, const T* up, T* dgate, T* dup, int64_t n, cudaStream_t stream) {
  return Launch<T, BwdOp>({{dout, gate, up}}, {{dgate, dup}}, n, stream);
}

// One V-element chunk of a row; V = 1: a scalar.
template <typename T, int V>
struct Chunk {
  float v[V];
};
template <typename T, int V>
__device__ __forceinline__ Chunk<T, V> LoadChunk(const T* p) {
  Chunk<T, V> c;
  if constexpr (V == 1) {
    c.v[0] = ToFloat(*p);
  } else {
    const Vec<T> x = LoadVec(p);
#pragma unroll
    for (int j = 0; j < V; ++j) c.v[j] = ToFloat(x.v[j]);
  }
  return c;
}
template <typename T, int V>
__device__ __forceinline__ void StoreChunk(T* p, const Chunk<T, V>& c) {
  if constexpr (V == 1) {
    *p = FromFloat<T>(c.v[0]);
  } else {
    Vec<T> x;
#pragma unroll
    for (int j = 0; j < V; ++j) x.v[j] = FromFloat<T>(c.v[j]);
    StoreVec(p, x);
  }
}

// Forward: out rows at out + r * ld_out (dout, dup unused). Backward: dout rows at dout + r * ld_out,
// dgate (in `out`) and dup rows at + r * ld_in.
template <typename T, int V, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    SwiGluRowsKernel(const T* dout, int64_t ld_out, const T* gate, const T* up, int64_t ld_in, T* out, T* dup,
                     int64_t rows, int64_t cols) {
  const int64_t per_row = cols / V, chunks = rows * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / per_row, c = (i - r * per_row) * V;
    const auto g = LoadChunk<T, V>(gate + r * ld_in + c);
    const auto u = LoadChunk<T, V>(up + r * ld_in + c);
    if constexpr (kBackward) {
      const auto d = LoadChunk<T, V>(dout + r * ld_out + c);
      Chunk<T, V> dg, du;
#pragma unroll
      for (int j = 0; j < V; ++j) BwdMath(d.v[j], g.v[j], u.v[j], dg.v[j], du.v[j]);
      StoreChunk<T, V>(out + r * ld_in + c, dg);
      StoreChunk<T, V>(dup + r * ld_in + c, du);
    } else {
      Chunk<T, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = FwdMath(g.v[j], u.v[j]);
      StoreChunk<T, V>(out + r * ld_out + c, o);
    }
  }
}

unsigned RowsGrid(int64_t chunks) {
  return static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(chunks, kThreads), 1, 65536));
}

template <typename T>
bool RowsVectorizable(std::initializer_list<const void*> ptrs, std::initializer_list<int64_t> dims) {
  for (const void* p : ptrs) {
    if (!detail::Aligned16(p)) return false;
  }
  for (int64_t d : dims) {
    if (d % kVec<T> != 0) return false;
  }
  return true;
}

template <typename T>
cudaError_t ForwardRows(const T* gate, const T* up, int64_t ld_in, T* out, int64_t ld_out, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
  constexpr int V = kVec<T>;
  if (RowsVectorizable<T>({gate, up, out}, {cols, ld_in, ld_out})) {
    SwiGluRowsKernel<T, V, false><<<RowsGrid(rows * (cols / V)), kThreads, 0, stream>>>(nullptr, ld_out, gate, up,
                                                                                          ld_in, out, nullptr, rows, cols);
  } else {
    SwiGluRowsKernel<T, 1, false><<<RowsGrid(rows * cols), kThreads, 0, stream>>>(nullptr, ld_out, gate, up, ld_in,
                                                                                   out, nullptr, rows, cols);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t BackwardRows(const T* dout, int64_t ld_out, const T* gate, const T* up, int64_t ld_in, T* dgate, T* dup,
                         int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  if (RowsVectorizable<T>({dout, gate, up, dgate, dup}, {cols, ld_in, ld_out})) {
    SwiGluRowsKernel<T, V, true><<<RowsGrid(rows * (cols / V)), kThreads, 0, stream>>>(dout, ld_out, gate, up,
                                                                                         ld_in, dgate, dup, rows, cols);
  } else {
    SwiGluRowsKernel<T, 1, true><<<RowsGrid(rows * cols), kThreads, 0, stream>>>(dout, ld_out, gate, up, ld_in, dgate,
                                                                                  dup, rows, cols);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t SwiGluForwardRows(DType dtype, const void* gate, const void* up, int64_t ld_in, void* out, int64_t ld_out,
                              int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || ld_in < cols || ld_out < cols) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (gate == nullptr || up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (dtype == DType::kF32) {
    return ForwardRows(static_cast<const float*>(gate), static_cast<const float*>(up), ld_in, static_cast<float*>(out),
                       ld_out, rows, cols, stream);
  }
  return ForwardRows(static_cast<const __nv_bfloat16*>(gate), static_cast<const __nv_bfloat16*>(up), ld_in,
                     static_cast<__nv_bfloat16*>(out), ld_out, rows, cols, stream);
}

cudaError_t SwiGluBackwardRows(DType dtype, const void* dout, int64_t ld_out, const void* gate, const void* up,
                               int64_t ld_in, void* dgate, void* dup, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || ld_in < cols || ld_out < cols) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (dout == nullptr || gate == nullptr || up == nullptr || dgate == nullptr || dup == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (dtype == DType::kF32) {
    return BackwardRows(static_cast<const float*>(dout), ld_out, static_cast<const float*>(gate),
                        static_cast<const float*>(up), ld_in, static_cast<float*>(dgate), static_cast<float*>(dup),
                        rows, cols, stream);
  }
  return BackwardRows(static_cast<const __nv_bfloat16*>(dout), ld_out, static_cast<const __nv_bfloat16*>(gate),
                      static_cast<const __nv_bfloat16*>(up), ld_in, static_cast<__nv_bfloat16*>(dgate),
                      static_cast<__nv_bfloat16*>(dup), rows, cols, stream);
}

cudaError_t SwiGluForward(DType dtype, const void* gate, const void* up, void* out, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (gate == nullptr || up == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if (dtype == DType::kF32) {
    return Forward(static_cast<const float*>(gate), static_cast<const float*>(up), static_cast<float*>(out), n, stream);
  }
  return Forward(static_cast<const __nv_bfloat16*>(gate), static_cast<const __nv_bfloat16*>(up),
                 static_cast<__nv_bfloat16*>(out), n, stream);
}

cudaError_t SwiGluBackward(DType dtype, const void* dout, const void* gate, const void* up, void* dgate, void* dup,
                           int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dout == nullptr || gate == nullptr || up == nullptr || dgate == nullptr || dup == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (dtype == DType::kF32) {
    return Backward(static_cast<const float*>(dout), static_cast<const float*>(gate), static_cast<const float*>(up),
                    static_cast<float*>(dgate), static_cast<float*>(dup), n, stream);
  }
  return Backward(static_cast<const __nv_bfloat16*>(dout), static_cast<const __nv_bfloat16*>(gate),
                  static_cast<const __nv_bfloat16*>(up), static_cast<__nv_bfloat16*>(dgate),
                  static_cast<__nv_bfloat16*>(dup), n, stream);
}

}  // namespace ftd::kernels
