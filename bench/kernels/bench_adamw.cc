// AdamW benchmark: one optimizer step over the parameters of 4 LLaMA-3.1-8B decoder layers (q, k, v, o,
// gate, up, down, two norms each) in the model dtype with moments in the same dtype: our multi-tensor
// AdamWStep (kernels/adamw.h) against at::_fused_adamw_ (LibTorch's fused kernel, what the engine runs
// today: one call for the decayed tensors, one for the norms). Also the global gradient norm: our
// MultiTensorSumSquares against the engine's _foreach_norm + norm of the norms.
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench/kernels/bench.h"
#include "kernels/adamw.h"

namespace ftd::bench {
namespace {

kernels::DType KDType(torch::ScalarType t) { return t == torch::kFloat ? kernels::DType::kF32 : kernels::DType::kBF16; }

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

}  // namespace

void BenchAdamW(const BenchConfig& cfg, std::vector<Row>& rows) {
  constexpr int kLayers = 4;
  constexpr double kLr = 1e-5, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1;
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const auto f32 = opts.dtype(torch::kFloat);
  const int64_t hd = cfg.hidden, q_out = cfg.heads * cfg.head_dim, kv_out = cfg.kv_heads * cfg.head_dim;
  const std::vector<std::vector<int64_t>> layer_shapes = {{q_out, hd},
                                                          {kv_out, hd},
                                                          {kv_out, hd},
                                                          {hd, q_out},
                                                          {cfg.intermediate, hd},
                                                          {cfg.intermediate, hd},
                                                          {hd, cfg.intermediate},
                                                          {hd},
                                                          {hd}};

  struct Slot {
    torch::Tensor p, g, m, v, step;
    bool decay;
  };
  std::vector<Slot> slots;
  int64_t numel = 0;
  for (int l = 0; l < kLayers; ++l) {
    for (const auto& shape : layer_shapes) {
      Slot s;
      s.p = 0.02 * torch::randn(shape, opts);
      s.g = 1e-3 * torch::randn(shape, opts);
      s.m = 1e-4 * torch::randn(shape, opts);
      s.v = (1e-4 * torch::randn(shape, opts)).square();
      s.step = torch::full({}, 10.0, f32);
      s.decay = shape.size() >= 2;
      numel += s.p.numel();
      slots.push_back(std::move(s));
    }
  }

  // Ours: one launch for all 36 tensors. The descriptors are host memory, built once (the engine builds
  // them per step; it is a few microseconds of host time).
  std::vector<kernels::AdamWTensor> desc;
  for (auto& s : slots) {
    desc.push_back(kernels::AdamWTensor{s.p.data_ptr(), nullptr, s.g.data_ptr(), s.m.data_ptr(), s.v.data_ptr(),
                                        s.p.numel(), static_cast<float>(s.decay ? kWeightDecay : 0.0)});
  }
  const kernels::AdamWParams params{static_cast<float>(kLr),  static_cast<float>(kBeta1), static_cast<float>(kBeta2),
                                    static_cast<float>(kEps), KDType(cfg.dtype),          KDType(cfg.dtype),
                                    KDType(cfg.dtype)};
  const auto step = torch::full({}, 10.0, f32);
  auto ours = [&] {
    Ok(kernels::AdamWStep(desc.data(), static_cast<int>(desc.size()), params, step.data_ptr<float>(), nullptr, nullptr,
                          at::cuda::getCurrentCUDAStream().stream()),
       "AdamWStep");
  };

  // LibTorch: the engine's two _fused_adamw_ calls (decayed tensors, then the norms' weights).
  std::vector<torch::Tensor> p[2], g[2], m[2], v[2], st[2];
  for (auto& s : slots) {
    const int i = s.decay ? 0 : 1;
    p[i].push_back(s.p);
    g[i].push_back(s.g);
    m[i].push_back(s.m);
    v[i].push_back(s.v);
    st[i].push_back(s.step);
  }
  auto eager = [&] {
    for (int i = 0; i < 2; ++i) {
      at::_fused_adamw_(p[i], g[i], m[i], v[i], /*max_exp_avg_sqs=*/{}, st[i], kLr, kBeta1, kBeta2,
                        i == 0 ? kWeightDecay : 0.0, kEps, /*amsgrad=*/false, /*maximize=*/false);
    }
  };

  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  const std::string note = std::string(c10::toString(cfg.dtype)) + " params and moments, " + std::to_string(kLayers) +
                           " layers, " + std::to_string(slots.size()) + " tensors, " + std::to_string(numel) +
                           " elements";
  Row r;
  r.family = "adamw";
  r.variant = "step";
  r.tokens = 0;
  r.ours_us = TimeUs(ours, cfg);
  r.eager_us = TimeUs(eager, cfg);
  // params read + written, grads read, both moments read + written.
  r.bytes = static_cast<double>(numel) * esize * (2 + 1 + 4);
  r.ours_peak_bytes = PeakBytes(ours);
  r.eager_peak_bytes = PeakBytes(eager);
  r.note = note;
  rows.push_back(r);

  // Global gradient norm over the same tensors.
  std::vector<const void*> gptr;
  std::vector<int64_t> gnumel;
  std::vector<torch::Tensor> grads;
  for (auto& s : slots) {
    gptr.push_back(s.g.data_ptr());
    gnumel.push_back(s.g.numel());
    grads.push_back(s.g);
  }
  const size_t ws_bytes = kernels::MultiTensorSumSquaresWorkspaceBytes(gnumel.data(), static_cast<int>(gnumel.size()));
  auto ours_norm = [&] {
    auto ws = torch::empty({static_cast<int64_t>(std::max<size_t>(ws_bytes, 16))}, opts.dtype(torch::kUInt8));
    auto out = torch::empty({}, f32);
    Ok(kernels::MultiTensorSumSquares(gptr.data(), gnumel.data(), static_cast<int>(gptr.size()), KDType(cfg.dtype),
                                      out.data_ptr<float>(), ws.data_ptr(), ws_bytes,
                                      at::cuda::getCurrentCUDAStream().stream()),
       "MultiTensorSumSquares");
    const auto norm = out.sqrt();
  };
  auto eager_norm = [&] {
    const auto norms = at::_foreach_norm(grads, 2);
    const auto norm = torch::stack(norms).to(torch::kFloat).norm();
  };
  Row n;
  n.family = "adamw";
  n.variant = "grad_norm";
  n.tokens = 0;
  n.ours_us = TimeUs(ours_norm, cfg);
  n.eager_us = TimeUs(eager_norm, cfg);
  n.bytes = static_cast<double>(numel) * esize;  // grads read once
  n.ours_peak_bytes = PeakBytes(ours_norm);
  n.eager_peak_bytes = PeakBytes(eager_norm);
  n.note = note;
  rows.push_back(n);
}

}  // namespace ftd::bench
