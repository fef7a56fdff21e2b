// Cross-entropy with an online softmax (Milakov & Gimelshein): forward and backward launchers.
//
// What is fused
//   Forward: one pass over each logits row computes the running max and the sum of exponentials
//   rescaled to it, then lse and the loss; nothing of size [rows, vocab] is written.
//   Backward: one pass over each row recomputes softmax = exp(logit - lse) from the saved lse,
//   subtracts the one-hot label, scales by the row's upstream gradient and writes dlogits (possibly
//   in place over the logits). No softmax tensor is materialised.
//
// Shapes, dtypes, layout (all device pointers; T is fp32 or bf16, chosen by DType)
//   logits:    (rows, vocab) T, row-major with row stride ld >= vocab elements     read
//   labels:    (rows) int64                                                         read
//   lse:       (rows) fp32   (=) log(sum_j exp(logits[r, j]))  for every row, ignored ones included
//   loss:      (rows) fp32   (=) lse[r] - logits[r, labels[r]]; 0 where labels[r] == ignore_index;
//                            NaN where labels[r] is outside [0, vocab) and not ignore_index
//   grad_loss: fp32 at grad_loss[r * grad_stride] (stride 0: one scalar; 1: per row); nullptr = 1
//   dlogits:   (rows, vocab) T, row stride ld_out >= vocab                         (=) columns [0, vocab)
//              dlogits[r, j] = g_r * (exp(logits[r, j] - lse[r]) - (j == labels[r]));
//              0 for ignored rows (their logits are not read), NaN for rows with an invalid label.
//              May alias logits exactly (same pointer, ld_out == ld); columns >= vocab untouched.
//   The caller reduces loss over rows (sum, or sum / count of non-ignored rows for a mean).
//
// Precision
//   fp32 arithmetic inside: inputs converted to fp32, exponentials as 2^((x - m) * log2 e) with the
//   hardware ex2 (relative error ~2^-22), per-thread fp32 sums combined by a block tree.
//   Expected max relative error against a float64 reference on the same (quantized) inputs: ~1e-6
//   for loss and lse; dlogits in fp32 ~1e-6, in bf16 dominated by the output's own rounding (2^-8).
//   An all -inf row gives lse = -inf and loss NaN; a NaN logit makes its row's lse and loss NaN.
//
// Alignment and tails
//   Pointers must be aligned to their element size. Each row is split on the fly into a scalar head
//   up to the first 16-byte boundary, a body of 16-byte vectors (8 bf16 / 4 fp32) loaded four at a
//   time per thread, and a scalar tail, so any ld, vocab and base offset take the vector path.
//   In the backward pass the vector path needs logits and dlogits rows at the same offset modulo 16
//   bytes (always true in place); otherwise that row takes a plain scalar loop.
//
// Parallel shape
//   One block per row (grid-stride over rows), 128/256/512 threads by vocab size; at most 64
//   registers a thread so that two 512-thread blocks fit on an SM: 256 rows of the 128256 vocab are
//   all resident at once on a 132-SM H100/H200, and each thread keeps 64 bytes of loads in flight.
#include "kernels/cross_entropy.h"

#include <climits>
#include <limits>

#include "kernels/common.cuh"

namespace ftd::kernels {
namespace {

using namespace detail;  // the device helpers of common.cuh

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kUnroll = 4;  // 16-byte vectors in flight per thread in the body loops

// `#pragma unroll` for the device pass only (the host compiler warns about the pragma).
#ifdef __CUDA_ARCH__
#define CE_UNROLL _Pragma("unroll")
#else
#define CE_UNROLL
#endif

// The per-thread work below is __host__ __device__ so that it can also be run on the CPU, one
// thread at a time, by a harness that emulates the launches; the kernels only add the row loop and
// the block reductions.

__host__ __device__ __forceinline__ float NaN() { return std::numeric_limits<float>::quiet_NaN(); }

// 2^x with the hardware approximation (denormal results flush to 0: they do not change any sum).
__host__ __device__ __forceinline__ float Exp2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Folds n values into a thread's running state: m is the largest value seen, s the sum of
// exp(v - m) over the values seen. One rescale per call, so callers pass a batch at once.
template <int N>
__host__ __device__ __forceinline__ void Absorb(const float (&v)[N], float& m, float& s) {
  float vmax = v[0];
  CE_UNROLL
  for (int i = 1; i < N; ++i) vmax = fmaxf(vmax, v[i]);
  if (vmax > m) {  // also false for NaN and for an all -inf batch
    s *= Exp2((m - vmax) * kLog2e);  // m = -inf: factor 0 and s is still 0
    m = vmax;
  }
  // While m is -inf every value so far was -inf (or NaN): shift by 0 so -inf contributes 0 and NaN
  // stays NaN, instead of computing -inf - -inf.
  const float shift = m == -INFINITY ? 0.f : m;
  float acc = 0.f;
  CE_UNROLL
  for (int i = 0; i < N; ++i) acc += Exp2((v[i] - shift) * kLog2e);
  s += acc;
}

// A row split at 16-byte boundaries: elements [0, head) and [tail0, vocab) are scalar, the nvec
// vectors in between start 16-byte aligned at row + head.
struct RowSplit {
  int64_t head, nvec, tail0;
};

template <typename T>
__host__ __device__ __forceinline__ RowSplit Split(const void* row, int64_t vocab) {
  const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15u);
  int64_t head = mis == 0 ? 0 : (16 - mis) / static_cast<int>(sizeof(T));
  head = head < vocab ? head : vocab;
  const int64_t nvec = (vocab - head) / kVec<T>;
  return {head, nvec, head + nvec * kVec<T>};
}

// Thread t's share of row r of the forward pass: its running (m, s) over the elements it owns and,
// for thread 0, the label's logit (loaded first so that its latency hides behind the row's loads).
template <typename T, int kThreads>
__host__ __device__ __forceinline__ void ForwardRowThread(const T* __restrict__ row, int64_t vocab, int64_t label,
                                                          bool wants_label, int t, float& m, float& s,
                                                          float& label_logit) {
  constexpr int V = kVec<T>;
  label_logit = (t == 0 && wants_label) ? ToFloat(row[label]) : 0.f;
  m = -INFINITY;
  s = 0.f;
  const RowSplit sp = Split<T>(row, vocab);
  if (t < sp.head) {
    const float v[1] = {ToFloat(row[t])};
    Absorb(v, m, s);
  }
  if (sp.tail0 + t < vocab) {
    const float v[1] = {ToFloat(row[sp.tail0 + t])};
    Absorb(v, m, s);
  }
  const Vec<T>* body = reinterpret_cast<const Vec<T>*>(row + sp.head);
  int64_t i = t;
  for (; i + (kUnroll - 1) * kThreads < sp.nvec; i += kUnroll * kThreads) {
    Vec<T> q[kUnroll];
    CE_UNROLL
    for (int u = 0; u < kUnroll; ++u) q[u] = body[i + u * kThreads];
    float v[kUnroll * V];
    CE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      CE_UNROLL
      for (int k = 0; k < V; ++k) v[u * V + k] = ToFloat(q[u].v[k]);
    }
    Absorb(v, m, s);
  }
  for (; i < sp.nvec; i += kThreads) {
    const Vec<T> q = body[i];
    float v[V];
    CE_UNROLL
    for (int k = 0; k < V; ++k) v[k] = ToFloat(q.v[k]);
    Absorb(v, m, s);
  }
}

// A thread's sum rescaled to the row max. m == -inf: s is 0, or NaN if a NaN was seen; either way it
// is passed on unscaled.
__host__ __device__ __forceinline__ float Rescaled(float m, float s, float row_max) {
  return m == -INFINITY ? s : s * Exp2((m - row_max) * kLog2e);
}

__host__ __device__ __forceinline__ void FinishRow(float row_max, float total, int64_t label, int64_t vocab,
                                                   int64_t ignore_index, float label_logit, float* loss,
                                                   float* lse) {
  const float row_lse = row_max + logf(total);
  *lse = row_lse;
  if (label == ignore_index) {
    *loss = 0.f;
  } else {
    *loss = (label >= 0 && label < vocab) ? row_lse - label_logit : NaN();
  }
}

template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    CeForwardKernel(const T* __restrict__ logits, int64_t ld, const int64_t* __restrict__ labels,
                    float* __restrict__ loss, float* __restrict__ lse, int64_t rows, int64_t vocab,
                    int64_t ignore_index) {
  __shared__ float scratch[32];
  const int t = threadIdx.x;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t label = labels[r];
    const bool wants_label = label != ignore_index && label >= 0 && label < vocab;
    float m, s, label_logit;
    ForwardRowThread<T, kThreads>(logits + r * ld, vocab, label, wants_label, t, m, s, label_logit);
    // Combine the threads' (m, s): rescale each sum to the row max, then add.
    const float row_max = BlockMax(m, scratch);
    const float total = BlockSum(Rescaled(m, s, row_max), scratch);
    if (t == 0) FinishRow(row_max, total, label, vocab, ignore_index, label_logit, loss + r, lse + r);
  }
}

// g * (softmax - onehot) for one element.
__host__ __device__ __forceinline__ float GradOf(float x, float lse, float g, bool is_label) {
  return g * (Exp2((x - lse) * kLog2e) - (is_label ? 1.f : 0.f));
}

template <typename T, int kThreads>
__host__ __device__ __forceinline__ void ZeroRowThread(T* out, int64_t vocab, int t) {
  const RowSplit sp = Split<T>(out, vocab);
  if (t < sp.head) out[t] = FromFloat<T>(0.f);
  if (sp.tail0 + t < vocab) out[sp.tail0 + t] = FromFloat<T>(0.f);
  Vec<T> zero;
  CE_UNROLL
  for (int k = 0; k < kVec<T>; ++k) zero.v[k] = FromFloat<T>(0.f);
  Vec<T>* body = reinterpret_cast<Vec<T>*>(out + sp.head);
  for (int64_t i = t; i < sp.nvec; i += kThreads) body[i] = zero;
}

// Thread t's share of row r of the backward pass. logits and dlogits are not __restrict__: they may
// be the same memory (in place). Each element is read and then written by the same thread, and no
// thread reads an element another one writes.
template <typename T, int kThreads>
__host__ __device__ __forceinline__ void BackwardRowThread(const T* logits, int64_t ld,
                                                           const int64_t* __restrict__ labels,
                                                           const float* __restrict__ lse,
                                                           const float* __restrict__ grad, int64_t grad_stride,
                                                           T* dlogits, int64_t ld_out, int64_t r, int64_t vocab,
                                                           int64_t ignore_index, int t) {
  constexpr int V = kVec<T>;
  const T* in = logits + r * ld;
  T* out = dlogits + r * ld_out;
  // The three per-row loads are independent, so their latencies overlap (lse is written for every
  // row by the forward pass, so reading it for an ignored row is fine).
  const int64_t label = labels[r];
  const float saved_lse = lse[r];
  const float g = grad == nullptr ? 1.f : grad[r * grad_stride];
  if (label == ignore_index) {
    ZeroRowThread<T, kThreads>(out, vocab, t);
    return;
  }
  const bool in_range = label >= 0 && label < vocab;
  const float row_lse = in_range ? saved_lse : NaN();  // an invalid label poisons the whole row

  if ((reinterpret_cast<uintptr_t>(in) & 15u) != (reinterpret_cast<uintptr_t>(out) & 15u)) {
    for (int64_t j = t; j < vocab; j += kThreads) out[j] = FromFloat<T>(GradOf(ToFloat(in[j]), row_lse, g, j == label));
    return;
  }
  const RowSplit sp = Split<T>(in, vocab);
  if (t < sp.head) out[t] = FromFloat<T>(GradOf(ToFloat(in[t]), row_lse, g, t == label));
  if (sp.tail0 + t < vocab) {
    const int64_t j = sp.tail0 + t;
    out[j] = FromFloat<T>(GradOf(ToFloat(in[j]), row_lse, g, j == label));
  }
  const Vec<T>* src = reinterpret_cast<const Vec<T>*>(in + sp.head);
  Vec<T>* dst = reinterpret_cast<Vec<T>*>(out + sp.head);
  const int64_t label_rel = label - sp.head;  // label's index counted from the body's start
  // Position of the label inside vector i, or -1.
  auto label_lane = [label_rel](int64_t i) {
    const int64_t off = label_rel - i * V;
    return off >= 0 && off < V ? static_cast<int>(off) : -1;
  };
  int64_t i = t;
  for (; i + (kUnroll - 1) * kThreads < sp.nvec; i += kUnroll * kThreads) {
    Vec<T> q[kUnroll];
    CE_UNROLL
    for (int u = 0; u < kUnroll; ++u) q[u] = src[i + u * kThreads];
    CE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int lane = label_lane(i + u * kThreads);
      Vec<T> o;
      CE_UNROLL
      for (int k = 0; k < V; ++k) o.v[k] = FromFloat<T>(GradOf(ToFloat(q[u].v[k]), row_lse, g, k == lane));
      dst[i + u * kThreads] = o;
    }
  }
  for (; i < sp.nvec; i += kThreads) {
    const Vec<T> q = src[i];
    const int lane = label_lane(i);
    Vec<T> o;
    CE_UNROLL
    for (int k = 0; k < V; ++k) o.v[k] = FromFloat<T>(GradOf(ToFloat(q.v[k]), row_lse, g, k == lane));
    dst[i] = o;
  }
}

template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    CeBackwardKernel(const T* logits, int64_t ld, const int64_t* __restrict__ labels,
                     const float* __restrict__ lse, const float* __restrict__ grad, int64_t grad_stride,
                     T* dlogits, int64_t ld_out, int64_t rows, int64_t vocab, int64_t ignore_index) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    BackwardRowThread<T, kThreads>(logits, ld, labels, lse, grad, grad_stride, dlogits, ld_out, r, vocab,
                                   ignore_index, threadIdx.x);
  }
}

// Threads per block from the number of 16-byte vectors in a row: enough work per thread for the
// 4-deep unroll on large vocabularies, small blocks for small ones.
int ThreadsFor(int64_t vocab, int vec) {
  const int64_t nvec = vocab / vec;
  return nvec >= 2048 ? 512 : nvec >= 512 ? 256 : 128;
}

unsigned GridFor(int64_t rows) { return static_cast<unsigned>(rows < INT_MAX ? rows : INT_MAX); }

bool AlignedTo(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T>
cudaError_t LaunchForward(const T* logits, int64_t ld, const int64_t* labels, float* loss, float* lse,
                          int64_t rows, int64_t vocab, int64_t ignore_index, cudaStream_t stream) {
  const unsigned grid = GridFor(rows);
  switch (ThreadsFor(vocab, kVec<T>)) {
    case 512:
      CeForwardKernel<T, 512><<<grid, 512, 0, stream>>>(logits, ld, labels, loss, lse, rows, vocab, ignore_index);
      break;
    case 256:
      CeForwardKernel<T, 256><<<grid, 256, 0, stream>>>(logits, ld, labels, loss, lse, rows, vocab, ignore_index);
      break;
    default:
      CeForwardKernel<T, 128><<<grid, 128, 0, stream>>>(logits, ld, labels, loss, lse, rows, vocab, ignore_index);
      break;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchBackward(const T* logits, int64_t ld, const int64_t* labels, const float* lse,
                           const float* grad, int64_t grad_stride, T* dlogits, int64_t ld_out, int64_t rows,
                           int64_t vocab, int64_t ignore_index, cudaStream_t stream) {
  const unsigned grid = GridFor(rows);
  switch (ThreadsFor(vocab, kVec<T>)) {
    case 512:
      CeBackwardKernel<T, 512><<<grid, 512, 0, stream>>>(logits, ld, labels, lse, grad, grad_stride, dlogits,
                                                         ld_out, rows, vocab, ignore_index);
      break;
    case 256:
      CeBackwardKernel<T, 256><<<grid, 256, 0, stream>>>(logits, ld, labels, lse, grad, grad_stride, dlogits,
                                                         ld_out, rows, vocab, ignore_index);
      break;
    default:
      CeBackwardKernel<T, 128><<<grid, 128, 0, stream>>>(logits, ld, labels, lse, grad, grad_stride, dlogits,
                                                         ld_out, rows, vocab, ignore_index);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

#undef CE_UNROLL

cudaError_t CrossEntropyForward(DType dtype, const void* logits, int64_t ld, const int64_t* labels, float* loss,
                                float* lse, int64_t rows, int64_t vocab, int64_t ignore_index,
                                cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || ld < vocab) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || labels == nullptr || loss == nullptr || lse == nullptr) return cudaErrorInvalidValue;
  if (!AlignedTo(logits, DTypeSize(dtype))) return cudaErrorInvalidValue;
  if (dtype == DType::kF32) {
    return LaunchForward(static_cast<const float*>(logits), ld, labels, loss, lse, rows, vocab, ignore_index,
                         stream);
  }
  return LaunchForward(static_cast<const __nv_bfloat16*>(logits), ld, labels, loss, lse, rows, vocab,
                       ignore_index, stream);
}

cudaError_t CrossEntropyBackward(DType dtype, const void* logits, int64_t ld, const int64_t* labels,
                                 const float* lse, const float* grad_loss, int64_t grad_stride, void* dlogits,
                                 int64_t ld_out, int64_t rows, int64_t vocab, int64_t ignore_index,
                                 cudaStream_t stream) {
  if (rows < 0 || vocab < 1 || ld < vocab || ld_out < vocab || grad_stride < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (logits == nullptr || labels == nullptr || lse == nullptr || dlogits == nullptr) return cudaErrorInvalidValue;
  const size_t es = DTypeSize(dtype);
  if (!AlignedTo(logits, es) || !AlignedTo(dlogits, es)) return cudaErrorInvalidValue;
  // In place is allowed only as an exact alias; any other overlap would race.
  const auto* a0 = static_cast<const char*>(logits);
  const auto* a1 = a0 + static_cast<size_t>((rows - 1) * ld + vocab) * es;
  const auto* b0 = static_cast<const char*>(dlogits);
  const auto* b1 = b0 + static_cast<size_t>((rows - 1) * ld_out + vocab) * es;
  if (a0 < b1 && b0 < a1 && !(a0 == b0 && ld == ld_out)) return cudaErrorInvalidValue;
  if (dtype == DType::kF32) {
    return LaunchBackward(static_cast<const float*>(logits), ld, labels, lse, grad_loss, grad_stride,
                          static_cast<float*>(dlogits), ld_out, rows, vocab, ignore_index, stream);
  }
  return LaunchBackward(static_cast<const __nv_bfloat16*>(logits), ld, labels, lse, grad_loss, grad_stride,
                        static_cast<__nv_bfloat16*>(dlogits), ld_out, rows, vocab, ignore_index, stream);
}

}  // namespace ftd::kernels
