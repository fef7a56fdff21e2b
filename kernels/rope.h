// Rotary position embedding (HF LLaMA rotate_half convention), forward and backward. Contract,
// precision and the alignment rules are at the top of kernels/rope.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common.h"

namespace ftd::kernels {

// x, out: [batch, seq, heads, head_dim] contiguous, `dtype`; cos, sin: [seq, head_dim / 2] fp32
// (row t = position t, column i = frequency i; llama3 scaling already applied). With h = head_dim / 2,
// for i < h at position t:
//   out[i]     = x[i] * cos[t, i] - x[i + h] * sin[t, i]
//   out[i + h] = x[i + h] * cos[t, i] + x[i] * sin[t, i]
// out (=) may alias x (in place). Requires batch, seq, heads >= 0, head_dim even and >= 2,
// seq < 2^31, heads * head_dim < 2^31, non-null pointers when there is any element.
cudaError_t RopeForward(DType dtype, const void* x, void* out, const float* cos, const float* sin, int64_t batch,
                        int64_t seq, int64_t heads, int64_t head_dim, cudaStream_t stream);

// The inverse rotation (the transpose of the forward):
//   dx[i] = dout[i] * cos + dout[i + h] * sin,  dx[i + h] = dout[i + h] * cos - dout[i] * sin.
// dx (=) may alias dout (in place). Same shapes and requirements as RopeForward.
cudaError_t RopeBackward(DType dtype, const void* dout, void* dx, const float* cos, const float* sin, int64_t batch,
                         int64_t seq, int64_t heads, int64_t head_dim, cudaStream_t stream);

}  // namespace ftd::kernels
