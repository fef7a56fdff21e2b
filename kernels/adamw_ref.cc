#include "kernels/adamw_ref.h"

#include <cmath>

namespace ftd::kernels::ref {

void AdamWStep(std::vector<double>* w, const std::vector<double>& grad, std::vector<double>* m, std::vector<double>* v,
               const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(h.beta1, h.step);
  const double bc2 = 1.0 - std::pow(h.beta2, h.step);
  const double step_size = h.lr / bc1;
  for (size_t i = 0; i < w->size(); ++i) {
    const double g = grad[i] * h.grad_scale;
    double& wi = (*w)[i];
    double& mi = (*m)[i];
    double& vi = (*v)[i];
    wi *= 1.0 - h.lr * h.weight_decay;
    mi = h.beta1 * mi + (1.0 - h.beta1) * g;
    vi = h.beta2 * vi + (1.0 - h.beta2) * g * g;
    wi -= step_size * mi / (std::sqrt(vi) / std::sqrt(bc2) + h.eps);
  }
}

double SumSquares(const std::vector<std::vector<double>>& grads) {
  double s = 0;
  for (const auto& g : grads) {
    for (double x : g) s += x * x;
  }
  return s;
}

}  // namespace ftd::kernels::ref
