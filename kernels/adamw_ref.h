// Plain C++ reference of kernels/adamw.cu in double precision, written for clarity; the GPU test
// compares the production launchers with it.
#pragma once

#include <vector>

namespace ftd::kernels::ref {

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;
  double step = 1;        // 1-based count of this update
  double grad_scale = 1;  // gradients are multiplied by it first
};

// One AdamW update (torch.optim.AdamW / torch._fused_adamw_), in place on w, m, v:
//   g = grad * grad_scale; w *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//   w -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).
void AdamWStep(std::vector<double>* w, const std::vector<double>& grad, std::vector<double>* m, std::vector<double>* v,
               const AdamWHyper& h);

// Sum over every tensor and element of g^2.
double SumSquares(const std::vector<std::vector<double>>& grads);

}  // namespace ftd::kernels::ref
