// RMSNorm benchmark: our fused forward + backward (kernels/rmsnorm.h) against the eager LibTorch ops of
// HF's LlamaRMSNorm (fp32 statistics, cast back, times the weight), forward + backward through autograd,
// on [tokens, hidden].
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <string>

#include "bench/kernels/bench.h"
#include "kernels/rmsnorm.h"

namespace ftd::bench {
namespace {

kernels::DType KDType(torch::ScalarType t) { return t == torch::kFloat ? kernels::DType::kF32 : kernels::DType::kBF16; }

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

}  // namespace

void BenchRmsNorm(const BenchConfig& cfg, std::vector<Row>& rows) {
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const int64_t n = cfg.hidden;
  const double eps = 1e-5;
  const kernels::DType dt = KDType(cfg.dtype);
  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  for (const int64_t tokens : cfg.tokens) {
    const auto x = torch::randn({tokens, n}, opts);
    const auto w = (1 + 0.1 * torch::randn({n}, opts)).to(cfg.dtype);
    const auto dy = torch::randn({tokens, n}, opts);

    // Ours: every output (and the dw workspace) allocated per call, as the autograd adapter does.
    auto ours = [&] {
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
      auto y = torch::empty({tokens, n}, opts);
      auto rstd = torch::empty({tokens}, opts.dtype(torch::kFloat));
      auto dx = torch::empty({tokens, n}, opts);
      auto dw = torch::empty({n}, opts);
      const size_t ws_bytes = std::max<size_t>(16, kernels::RmsNormBackwardWorkspaceBytes(tokens, n));
      auto ws = torch::empty({static_cast<int64_t>(ws_bytes)}, opts.dtype(torch::kUInt8));
      Ok(kernels::RmsNormForward(dt, x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), tokens, n,
                                 static_cast<float>(eps), stream),
         "RmsNormForward");
      Ok(kernels::RmsNormBackward(dt, dy.data_ptr(), x.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(), dx.data_ptr(),
                                  dw.data_ptr(), ws.data_ptr(), tokens, n, stream),
         "RmsNormBackward");
    };

    // Eager: HF LlamaRMSNorm.forward, then autograd for dx and dw.
    const auto xg = x.detach().requires_grad_(true), wg = w.detach().requires_grad_(true);
    auto eager = [&] {
      auto h = xg.to(torch::kFloat);
      const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
      h = h * torch::rsqrt(variance + eps);
      const auto y = wg * h.to(cfg.dtype);
      const auto grads = torch::autograd::grad({y}, {xg, wg}, {dy});
      TORCH_CHECK(grads.size() == 2);
    };

    Row r;
    r.family = "rmsnorm";
    r.variant = "fwd+bwd";
    r.tokens = tokens;
    r.ours_us = TimeUs(ours, cfg);
    r.eager_us = TimeUs(eager, cfg);
    // Forward: x read, y written (rows x n), w read, rstd written (fp32). Backward: dy and x read, dx
    // written, w read, rstd read, dw written.
    const double t = static_cast<double>(tokens), nd = static_cast<double>(n);
    r.bytes = 5 * t * nd * esize + 3 * nd * esize + 2 * t * 4;
    r.ours_peak_bytes = PeakBytes(ours);
    r.eager_peak_bytes = PeakBytes(eager);
    r.note = std::string(c10::toString(cfg.dtype)) + " [" + std::to_string(tokens) + ", " + std::to_string(n) + "]";
    rows.push_back(r);
  }
}

}  // namespace ftd::bench
