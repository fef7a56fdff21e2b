// Plain C++ reference of kernels/rmsnorm.cu in double precision, written for clarity; the GPU test
// compares the production launchers with it. Row-major (rows, n) matrices as flat vectors.
#pragma once

#include <cstdint>
#include <vector>

namespace ftd::kernels::ref {

// y = w * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps) per row. Outputs are resized.
void RmsNormForward(const std::vector<double>& x, const std::vector<double>& w, int64_t rows, int64_t n, double eps,
                    std::vector<double>* y, std::vector<double>* rstd);

// g = dy * w, xhat = x * rstd: dx = rstd * (g - xhat * mean(g * xhat)); dw = sum over rows of dy * xhat.
// rstd is taken as given (the value the kernel read). Outputs are resized.
void RmsNormBackward(const std::vector<double>& dy, const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>& rstd, int64_t rows, int64_t n, std::vector<double>* dx,
                     std::vector<double>* dw);

}  // namespace ftd::kernels::ref
