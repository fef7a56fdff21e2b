// Fused linear cross-entropy benchmark: our chunked lm_head + cross-entropy (kernels/fused_linear_ce.h)
// against the engine's eager path (torch::linear(x, W).to(float32) -> cross_entropy(sum) -> autograd
// for dx and dW), and against the three GEMMs alone (x W^T, dlogits^T x, dlogits W at full size):
// the fused version should take at most 1.1x the GEMMs' time.
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "bench/kernels/bench.h"
#include "kernels/fused_linear_ce.h"

namespace ftd::bench {
namespace {

constexpr int64_t kIgnoreIndex = -100;

kernels::DType KDType(torch::ScalarType t) { return t == torch::kFloat ? kernels::DType::kF32 : kernels::DType::kBF16; }

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

}  // namespace

void BenchFusedLinearCrossEntropy(const BenchConfig& cfg, std::vector<Row>& rows) {
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const auto f32 = opts.dtype(torch::kFloat);
  const int64_t hidden = cfg.hidden, vocab = cfg.vocab;
  const int64_t chunk_rows = kernels::kFusedLinearCeDefaultChunkRows;
  const kernels::DType dt = KDType(cfg.dtype);
  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  // Logits ~ N(0, 1) from x ~ N(0, 1).
  const auto w = (torch::randn({vocab, hidden}, f32) / std::sqrt(static_cast<double>(hidden))).to(cfg.dtype);
  const auto grad_scale = torch::ones({1}, f32);  // the gradient of the sum of the losses
  for (const int64_t tokens : cfg.tokens) {
    const auto x = torch::randn({tokens, hidden}, opts);
    const auto labels = torch::randint(0, vocab, {tokens}, opts.dtype(torch::kLong));
    const size_t ws_bytes = kernels::FusedLinearCrossEntropyWorkspaceBytes(dt, tokens, hidden, vocab, chunk_rows);

    // Ours: workspace and outputs allocated per call, as the autograd adapter does (dx and dW are
    // produced in the forward; the adapter's backward only scales them).
    auto ours = [&] {
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
      auto ws = torch::empty({static_cast<int64_t>(ws_bytes)}, opts.dtype(torch::kUInt8));
      auto loss = torch::empty({tokens}, f32);
      auto lse = torch::empty({tokens}, f32);
      auto dx = torch::empty({tokens, hidden}, opts);
      auto dw = torch::empty({vocab, hidden}, opts);
      Ok(kernels::FusedLinearCrossEntropy(at::cuda::getCurrentCUDABlasHandle(), dt, x.data_ptr(), w.data_ptr(),
                                          labels.data_ptr<int64_t>(), loss.data_ptr<float>(), lse.data_ptr<float>(),
                                          dx.data_ptr(), dw.data_ptr(), /*accumulate_dweight=*/false,
                                          grad_scale.data_ptr<float>(), ws.data_ptr(), ws_bytes, tokens, hidden, vocab,
                                          chunk_rows, kIgnoreIndex, stream),
         "FusedLinearCrossEntropy");
      const auto total = loss.sum();
    };

    // Eager: LlamaModel::Logits + LossSum, then autograd for dx and dW.
    const auto xg = x.detach().requires_grad_(true), wg = w.detach().requires_grad_(true);
    auto eager = [&] {
      const auto logits = torch::linear(xg, wg).to(torch::kFloat);
      const auto loss = torch::nn::functional::cross_entropy(
          logits, labels,
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
      const auto grads = torch::autograd::grad({loss}, {xg, wg});
      TORCH_CHECK(grads.size() == 2);
    };

    // The three GEMMs alone at full size, into preallocated outputs (the logits buffer stands in for
    // dlogits).
    auto logits_buf = torch::empty({tokens, vocab}, opts);
    auto dx_buf = torch::empty({tokens, hidden}, opts);
    auto dw_buf = torch::empty({vocab, hidden}, opts);
    auto gemms = [&] {
      at::mm_out(logits_buf, x, w.t());       // logits = x W^T        (tokens, vocab)
      at::mm_out(dw_buf, logits_buf.t(), x);  // dW = dlogits^T x      (vocab, hidden)
      at::mm_out(dx_buf, logits_buf, w);      // dx = dlogits W        (tokens, hidden)
    };

    const double t = static_cast<double>(tokens), h = static_cast<double>(hidden), v = static_cast<double>(vocab);
    const double flops = 6 * t * h * v;
    const double materialised = t * v * 2;  // the [tokens, vocab] logits in bf16
    Row r;
    r.family = "fused_linear_ce";
    r.variant = "fwd+bwd";
    r.tokens = tokens;
    r.ours_us = TimeUs(ours, cfg);
    r.eager_us = TimeUs(eager, cfg);
    // x, W and labels read; loss, lse, dx and dW written. Compute-bound: see TFLOP/s in the note.
    r.bytes = 2 * (t * h + v * h) * esize + t * (8 + 4 + 4);
    r.ours_peak_bytes = PeakBytes(ours);
    r.eager_peak_bytes = PeakBytes(eager);
    r.note = std::string(c10::toString(cfg.dtype)) + " hidden " + std::to_string(hidden) + " vocab " +
             std::to_string(vocab) + "; chunk_rows " + std::to_string(std::min(chunk_rows, tokens)) + ", workspace " +
             Fixed(static_cast<double>(ws_bytes) / (1 << 20), 1) + " MiB = " +
             Fixed(static_cast<double>(ws_bytes) / materialised, 3) + " x bf16 logits; ours " +
             Fixed(flops / (r.ours_us * 1e-6) / 1e12, 0) + " TFLOP/s";
    rows.push_back(r);

    Row g;
    g.family = "fused_linear_ce";
    g.variant = "vs 3 GEMMs";
    g.tokens = tokens;
    g.ours_us = r.ours_us;
    g.eager_us = TimeUs(gemms, cfg);
    g.bytes = r.bytes;
    g.ours_peak_bytes = r.ours_peak_bytes;
    g.eager_peak_bytes = PeakBytes(gemms);
    g.note = "eager = the 3 GEMMs alone (" + Fixed(flops / (g.eager_us * 1e-6) / 1e12, 0) +
             " TFLOP/s); ours / GEMMs = " + Fixed(g.ours_us / g.eager_us, 3) + " (target <= 1.1)";
    rows.push_back(g);
  }
}

}  // namespace ftd::bench
