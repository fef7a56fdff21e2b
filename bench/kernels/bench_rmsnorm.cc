// RMSNorm benchmark: our fused forward + backward (kernels/rmsnorm.h) against the eager LibTorch ops of
// HF's LlamaRMSNorm (fp32 statistics, cast back, times the weight), forward + backward through autograd,
// on [tokens, hidden]. Three rows per size:
//   fwd      the forward alone (ours: the launch, y and rstd allocated beforehand; eager: the ops)
//   bwd      the backward alone (ours: the launch, dx, dw and the workspace allocated beforehand;
//            eager: autograd over a graph built beforehand)
//   fwd+bwd  both, as the autograd adapter runs them: each direction allocates its outputs, then launches
//   copy     reference, not RMSNorm: a device-to-device copy of x into y (the forward's bytes at this size),
//            to show what launch, ramp-up and drain cost a copy this small against the 1 GiB copy
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
  // Planned once, as the worker's adapter does (it keeps one plan per device, dtype and width).
  kernels::DeviceProps props;
  Ok(kernels::CurrentDeviceProps(&props), "CurrentDeviceProps");
  kernels::RmsNormPlan plan;
  Ok(kernels::PlanRmsNorm(props, dt, n, &plan), "PlanRmsNorm");
  for (const int64_t tokens : cfg.tokens) {
    const auto x = torch::randn({tokens, n}, opts);
    const auto w = (1 + 0.1 * torch::randn({n}, opts)).to(cfg.dtype);
    const auto dy = torch::randn({tokens, n}, opts);
    const size_t ws_bytes = std::max<size_t>(16, kernels::RmsNormBackwardWorkspaceBytes(tokens, n));

    // Ours. Outputs of the separate directions, allocated once (the fwd and bwd rows time the launches).
    auto y = torch::empty({tokens, n}, opts);
    auto rstd = torch::empty({tokens}, opts.dtype(torch::kFloat));
    auto dx = torch::empty({tokens, n}, opts);
    auto dw = torch::empty({n}, opts);
    auto ws = torch::empty({static_cast<int64_t>(ws_bytes)}, opts.dtype(torch::kUInt8));
    auto forward = [&](torch::Tensor& y_out, torch::Tensor& rstd_out) {
      Ok(kernels::RmsNormForward(plan, x.data_ptr(), w.data_ptr(), y_out.data_ptr(), rstd_out.data_ptr<float>(), tokens,
                                 static_cast<float>(eps), at::cuda::getCurrentCUDAStream().stream()),
         "RmsNormForward");
    };
    auto backward = [&](const torch::Tensor& rstd_in, torch::Tensor& dx_out, torch::Tensor& dw_out,
                        torch::Tensor& ws_in) {
      Ok(kernels::RmsNormBackward(plan, dy.data_ptr(), x.data_ptr(), w.data_ptr(), rstd_in.data_ptr<float>(),
                                  dx_out.data_ptr(), dw_out.data_ptr(), ws_in.data_ptr(), tokens,
                                  at::cuda::getCurrentCUDAStream().stream()),
         "RmsNormBackward");
    };
    forward(y, rstd);  // the rstd the bwd row reads
    auto ours_fwd = [&] { forward(y, rstd); };
    auto ours_bwd = [&] { backward(rstd, dx, dw, ws); };
    // As the autograd adapter does: the forward allocates y and rstd, the backward dx, dw and the workspace.
    auto ours_both = [&] {
      auto y2 = torch::empty({tokens, n}, opts);
      auto rstd2 = torch::empty({tokens}, opts.dtype(torch::kFloat));
      forward(y2, rstd2);
      auto dx2 = torch::empty({tokens, n}, opts);
      auto dw2 = torch::empty({n}, opts);
      auto ws2 = torch::empty({static_cast<int64_t>(ws_bytes)}, opts.dtype(torch::kUInt8));
      backward(rstd2, dx2, dw2, ws2);
    };

    // Eager: HF LlamaRMSNorm.forward, then autograd for dx and dw.
    const auto xg = x.detach().requires_grad_(true), wg = w.detach().requires_grad_(true);
    auto eager_forward = [&] {
      auto h = xg.to(torch::kFloat);
      const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
      h = h * torch::rsqrt(variance + eps);
      return wg * h.to(cfg.dtype);
    };
    auto eager_fwd = [&] { (void)eager_forward(); };
    const auto eager_y = eager_forward();  // the graph the bwd row differentiates, again and again
    auto eager_bwd = [&] {
      const auto grads = torch::autograd::grad({eager_y}, {xg, wg}, {dy}, /*retain_graph=*/true);
      TORCH_CHECK(grads.size() == 2);
    };
    auto eager_both = [&] {
      const auto grads = torch::autograd::grad({eager_forward()}, {xg, wg}, {dy});
      TORCH_CHECK(grads.size() == 2);
    };

    // Bytes. Forward: x read, y written (rows x n), w read, rstd written (fp32). Backward: dy and x read,
    // dx written, w read, rstd read, dw written.
    const double t = static_cast<double>(tokens), nd = static_cast<double>(n);
    const double fwd_bytes = 2 * t * nd * esize + nd * esize + t * 4;
    const double bwd_bytes = 3 * t * nd * esize + 2 * nd * esize + t * 4;
    const std::string note =
        std::string(c10::toString(cfg.dtype)) + " [" + std::to_string(tokens) + ", " + std::to_string(n) + "]";
    auto add = [&](const char* variant, const std::function<void()>& ours, const std::function<void()>& eager,
                   double bytes) {
      Row r;
      r.family = "rmsnorm";
      r.variant = variant;
      r.tokens = tokens;
      r.ours_us = TimeUs(ours, cfg);
      r.eager_us = TimeUs(eager, cfg);
      r.bytes = bytes;
      r.ours_peak_bytes = PeakBytes(ours);
      r.eager_peak_bytes = PeakBytes(eager);
      r.note = note;
      rows.push_back(r);
    };
    add("fwd", ours_fwd, eager_fwd, fwd_bytes);
    add("bwd", ours_bwd, eager_bwd, bwd_bytes);
    add("fwd+bwd", ours_both, eager_both, fwd_bytes + bwd_bytes);
    Row c;
    c.family = "rmsnorm";
    c.variant = "copy";
    c.tokens = tokens;
    c.ours_us = TimeUs([&] { y.copy_(x); }, cfg);
    c.bytes = 2 * t * nd * esize;
    c.note = note + " reference: y.copy_(x)";
    rows.push_back(c);
  }
}

}  // namespace ftd::bench
