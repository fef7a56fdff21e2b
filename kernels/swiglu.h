// Fused SwiGLU (LLaMA MLP): out = silu(gate) * up, elementwise, forward and backward. Contract,
// precision and the tail/alignment rules are at the top of kernels/swiglu.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common.h"

namespace ftd::kernels {

// gate, up, out: n elements of `dtype` (any shape, contiguous). out (=) = silu(gate) * up.
// out may alias gate or up (in place). Requires n >= 0 and non-null pointers when n > 0.
cudaError_t SwiGluForward(DType dtype, const void* gate, const void* up, void* out, int64_t n, cudaStream_t stream);

// dout, gate, up, dgate, dup: n elements of `dtype`. With s = sigmoid(gate):
//   dgate (=) = dout * up * s * (1 + gate * (1 - s)),  dup (=) = dout * gate * s.
// dgate may alias gate and dup may alias up (in place); each output may also alias dout. dgate and dup
// must not overlap each other, and no buffer may partially overlap another.
cudaError_t SwiGluBackward(DType dtype, const void* dout, const void* gate, const void* up, void* dgate, void* dup,
                           int64_t n, cudaStream_t stream);

}  // namespace ftd::kernels
