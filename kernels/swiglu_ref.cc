#include "kernels/swiglu_ref.h"

#include <cmath>

namespace ftd::kernels::ref {
namespace {

double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

}  // namespace

void SwiGluForward(const std::vector<double>& gate, const std::vector<double>& up, std::vector<double>* out) {
  out->resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) (*out)[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

void SwiGluBackward(const std::vector<double>& dout, const std::vector<double>& gate, const std::vector<double>& up,
                    std::vector<double>* dgate, std::vector<double>* dup) {
  dgate->resize(gate.size());
  dup->resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double s = Sigmoid(gate[i]);
    (*dgate)[i] = dout[i] * up[i] * s * (1.0 + gate[i] * (1.0 - s));
    (*dup)[i] = dout[i] * gate[i] * s;
  }
}

}  // namespace ftd::kernels::ref
