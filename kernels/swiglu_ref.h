// Plain C++ reference of kernels/swiglu.cu in double precision, written for clarity; the GPU test
// compares the production launchers with it.
#pragma once

#include <vector>

namespace ftd::kernels::ref {

// out = silu(gate) * up = gate * sigmoid(gate) * up, elementwise. Outputs are resized.
void SwiGluForward(const std::vector<double>& gate, const std::vector<double>& up, std::vector<double>* out);

// s = sigmoid(gate): dgate = dout * up * s * (1 + gate * (1 - s)), dup = dout * gate * s. Outputs are resized.
void SwiGluBackward(const std::vector<double>& dout, const std::vector<double>& gate, const std::vector<double>& up,
                    std::vector<double>* dgate, std::vector<double>* dup);

}  // namespace ftd::kernels::ref
