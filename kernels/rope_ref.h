// Plain C++ reference of kernels/rope.cu in double precision, written for clarity; the GPU test compares
// the production launchers with it.
#pragma once

#include <cstdint>
#include <vector>

namespace ftd::kernels::ref {

// x, out: [batch, seq, heads, head_dim]; cos, sin: [seq, head_dim / 2]. With h = head_dim / 2, i < h:
// out[i] = x[i] cos - x[i + h] sin, out[i + h] = x[i + h] cos + x[i] sin. out is resized.
void RopeForward(const std::vector<double>& x, const std::vector<double>& cos, const std::vector<double>& sin,
                 int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, std::vector<double>* out);

// The transpose: dx[i] = dout[i] cos + dout[i + h] sin, dx[i + h] = dout[i + h] cos - dout[i] sin.
void RopeBackward(const std::vector<double>& dout, const std::vector<double>& cos, const std::vector<double>& sin,
                  int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, std::vector<double>* dx);

}  // namespace ftd::kernels::ref
