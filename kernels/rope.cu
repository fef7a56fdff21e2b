// Rotary position embedding, HF LLaMA rotate_half convention (the llama3 frequency scaling is already in
// the cos/sin tables), forward and backward; one read and one write of every element.
//
//   x / dout:  (batch, seq, heads, D) dtype, contiguous     (read)
//   out / dx:  (batch, seq, heads, D) dtype                 (=)  may alias x / dout (in place)
//   cos, sin:  (seq, D / 2) fp32, row t = position t        (read)
// With h = D / 2, for each (b, t, head) and i < h:
//   forward:   out[i] = x[i] c - x[i+h] s,      out[i+h] = x[i+h] c + x[i] s       (c, s = cos[t,i], sin[t,i])
//   backward:  dx[i]  = dy[i] c + dy[i+h] s,    dx[i+h]  = dy[i+h] c - dy[i] s     (the inverse rotation)
// dtype kF32 or kBF16; arithmetic in fp32, each output rounded once (fp32: ~1e-7 relative; bf16: 2^-9).
// In place is safe: the pair (i, i + h) of a row is read and written by one thread, reads first.
//
// Layout: one block per token (b, t) at a time (a grid-stride loop over tokens); its threads take the
// token's heads * h / W "chunks" (W consecutive i of one head) in turn, each loading x[i..i+W) and
// x[i+h..i+h+W) and the matching cos/sin. Paths: vector (W = 16-byte vector: 8 bf16 / 4 fp32) when
// h % W == 0 and x, out, cos, sin are 16-byte aligned (LLaMA: D = 128); scalar (W = 1) otherwise (e.g.
// D = 6, or unaligned views). Both are exercised by rope_test.cc.
#include <algorithm>
#include <climits>

#include "kernels/common.cuh"
#include "kernels/rope.h"

namespace ftd::kernels {
namespace {

using namespace detail;  // the device helpers of common.cuh

constexpr int kMaxThreads = 256;

template <typename T, int W>
struct alignas(W * sizeof(T)) Chunk {
  T v[W];
};

// W consecutive fp32 values (16-byte aligned when W is a multiple of 4).
template <int W>
__device__ __forceinline__ void LoadFloats(const float* p, float (&out)[W]) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int q = 0; q < W / 4; ++q) {
      const float4 v = reinterpret_cast<const float4*>(p)[q];
      out[4 * q] = v.x;
      out[4 * q + 1] = v.y;
      out[4 * q + 2] = v.z;
      out[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) out[j] = p[j];
  }
}

template <typename T, int W, bool kInverse>
__global__ void __launch_bounds__(kMaxThreads)
    RopeKernel(const T* in, T* out, const float* cos, const float* sin, int64_t tokens, int seq, int heads, int half) {
  const int cpr = half / W;     // chunks per head
  const int cpt = heads * cpr;  // chunks per token
  for (int64_t tok = blockIdx.x; tok < tokens; tok += gridDim.x) {
    const int64_t t = tok % seq;
    const float* cr = cos + t * half;
    const float* sr = sin + t * half;
    const int64_t token_base = tok * heads * 2 * half;
    for (int q = threadIdx.x; q < cpt; q += blockDim.x) {
      const int head = q / cpr;
      const int i = (q - head * cpr) * W;
      const int64_t off = token_base + static_cast<int64_t>(head) * 2 * half + i;
      const Chunk<T, W> a = *reinterpret_cast<const Chunk<T, W>*>(in + off);
      const Chunk<T, W> b = *reinterpret_cast<const Chunk<T, W>*>(in + off + half);
      float c[W], s[W];
      LoadFloats<W>(cr + i, c);
      LoadFloats<W>(sr + i, s);
      Chunk<T, W> oa, ob;
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const float xa = ToFloat(a.v[j]), xb = ToFloat(b.v[j]);
        const float sn = kInverse ? -s[j] : s[j];
        oa.v[j] = FromFloat<T>(xa * c[j] - xb * sn);
        ob.v[j] = FromFloat<T>(xb * c[j] + xa * sn);
      }
      *reinterpret_cast<Chunk<T, W>*>(out + off) = oa;
      *reinterpret_cast<Chunk<T, W>*>(out + off + half) = ob;
    }
  }
}

template <typename T, bool kInverse>
cudaError_t Launch(const void* in_v, void* out_v, const float* cos, const float* sin, int64_t batch, int64_t seq,
                   int64_t heads, int64_t head_dim, cudaStream_t stream) {
  constexpr int V = detail::kVec<T>;
  const T* in = static_cast<const T*>(in_v);
  T* out = static_cast<T*>(out_v);
  const int64_t tokens = batch * seq;
  const int half = static_cast<int>(head_dim / 2);
  const bool vec = half % V == 0 && detail::Aligned16(in) && detail::Aligned16(out) && detail::Aligned16(cos) &&
                   detail::Aligned16(sin);
  const int64_t chunks_per_token = heads * (vec ? half / V : half);
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, (chunks_per_token + 31) / 32 * 32));
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tokens, INT_MAX));
  if (vec) {
    RopeKernel<T, V, kInverse>
        <<<grid, threads, 0, stream>>>(in, out, cos, sin, tokens, static_cast<int>(seq), static_cast<int>(heads), half);
  } else {
    RopeKernel<T, 1, kInverse>
        <<<grid, threads, 0, stream>>>(in, out, cos, sin, tokens, static_cast<int>(seq), static_cast<int>(heads), half);
  }
  return cudaGetLastError();
}

template <bool kInverse>
cudaError_t Rope(DType dtype, const void* in, void* out, const float* cos, const float* sin, int64_t batch, int64_t seq,
                 int64_t heads, int64_t head_dim, cudaStream_t stream) {
  if (batch < 0 || seq < 0 || heads < 0 || head_dim < 2 || head_dim % 2 != 0 || seq > INT_MAX ||
      heads > INT_MAX / head_dim || (seq > 0 && batch > INT64_MAX / seq)) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0 || seq == 0 || heads == 0) return cudaSuccess;
  if (in == nullptr || out == nullptr || cos == nullptr || sin == nullptr) return cudaErrorInvalidValue;
  if (dtype == DType::kF32) return Launch<float, kInverse>(in, out, cos, sin, batch, seq, heads, head_dim, stream);
  return Launch<__nv_bfloat16, kInverse>(in, out, cos, sin, batch, seq, heads, head_dim, stream);
}

}  // namespace

cudaError_t RopeForward(DType dtype, const void* x, void* out, const float* cos, const float* sin, int64_t batch,
                        int64_t seq, int64_t heads, int64_t head_dim, cudaStream_t stream) {
  return Rope<false>(dtype, x, out, cos, sin, batch, seq, heads, head_dim, stream);
}

cudaError_t RopeBackward(DType dtype, const void* dout, void* dx, const float* cos, const float* sin, int64_t batch,
                         int64_t seq, int64_t heads, int64_t head_dim, cudaStream_t stream) {
  return Rope<true>(dtype, dout, dx, cos, sin, batch, seq, heads, head_dim, stream);
}

}  // namespace ftd::kernels
