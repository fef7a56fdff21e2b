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

// The same over `rows` rows of `cols` elements whose rows are strided (leading dimensions in elements):
// row r of gate at gate + r * ld_in, of up at up + r * ld_in, of out at out + r * ld_out. For a fused
// gate|up GEMM output y [rows, 2 * cols]: gate = y, up = y + cols, ld_in = 2 * cols. No aliasing.
cudaError_t SwiGluForwardRows(DType dtype, const void* gate, const void* up, int64_t ld_in, void* out, int64_t ld_out,
                              int64_t rows, int64_t cols, cudaStream_t stream);
// dout rows at dout + r * ld_out; gate/up as above; dgate and dup rows at dgate + r * ld_in, dup + r * ld_in
// (for the fused layout: dgate = dy, dup = dy + cols, the gradient of y in one buffer). No aliasing.
cudaError_t SwiGluBackwardRows(DType dtype, const void* dout, int64_t ld_out, const void* gate, const void* up,
                               int64_t ld_in, void* dgate, void* dup, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace ftd::kernels
