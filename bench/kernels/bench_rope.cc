// RoPE benchmark: our forward + backward (kernels/rope.h) on q [1, tokens, heads, head_dim] and
// k [1, tokens, kv_heads, head_dim] (a projection's output viewed per head) against HF's eager
// q * cos + rotate_half(q) * sin on the [B, H, T, D] transposed view, with cos/sin [T, D] in the model
// dtype, forward + backward through autograd.
#include <ATen/cuda/CUDAContext.h>

#include <cmath>
#include <string>

#include "bench/kernels/bench.h"
#include "kernels/rope.h"

namespace ftd::bench {
namespace {

kernels::DType KDType(torch::ScalarType t) { return t == torch::kFloat ? kernels::DType::kF32 : kernels::DType::kBF16; }

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, h), x.slice(-1, 0, h)}, -1);
}

}  // namespace

void BenchRope(const BenchConfig& cfg, std::vector<Row>& rows) {
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const auto f32 = opts.dtype(torch::kFloat);
  const int64_t d = cfg.head_dim, h = d / 2;
  const kernels::DType dt = KDType(cfg.dtype);
  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  for (const int64_t tokens : cfg.tokens) {
    // LLaMA tables: theta[t, i] = t * 500000^(-2i / d) (the llama3 scaling would only change the values).
    const auto inv_freq = torch::pow(500000.0, -torch::arange(0, h, f32) * 2.0 / static_cast<double>(d));
    const auto freqs = torch::outer(torch::arange(0, tokens, f32), inv_freq);  // [T, h]
    const auto cos32 = freqs.cos().contiguous(), sin32 = freqs.sin().contiguous();
    const auto emb = torch::cat({freqs, freqs}, -1);  // [T, D], HF's tables
    const auto cos = emb.cos().to(cfg.dtype), sin = emb.sin().to(cfg.dtype);

    const auto q = torch::randn({1, tokens, cfg.heads, d}, opts);
    const auto k = torch::randn({1, tokens, cfg.kv_heads, d}, opts);
    const auto dq = torch::randn({1, tokens, cfg.heads, d}, opts);  // gradients in the same layout
    const auto dk = torch::randn({1, tokens, cfg.kv_heads, d}, opts);

    auto ours = [&] {
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
      auto qo = torch::empty_like(q), ko = torch::empty_like(k), dqi = torch::empty_like(q), dki = torch::empty_like(k);
      const float* c = cos32.data_ptr<float>();
      const float* s = sin32.data_ptr<float>();
      Ok(kernels::RopeForward(dt, q.data_ptr(), qo.data_ptr(), c, s, 1, tokens, cfg.heads, d, stream), "RopeForward q");
      Ok(kernels::RopeForward(dt, k.data_ptr(), ko.data_ptr(), c, s, 1, tokens, cfg.kv_heads, d, stream),
         "RopeForward k");
      Ok(kernels::RopeBackward(dt, dq.data_ptr(), dqi.data_ptr(), c, s, 1, tokens, cfg.heads, d, stream),
         "RopeBackward q");
      Ok(kernels::RopeBackward(dt, dk.data_ptr(), dki.data_ptr(), c, s, 1, tokens, cfg.kv_heads, d, stream),
         "RopeBackward k");
    };

    const auto qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true);
    const auto dq_t = dq.transpose(1, 2), dk_t = dk.transpose(1, 2);  // [B, H, T, D] views, as the outputs
    auto eager = [&] {
      const auto qt = qg.transpose(1, 2), kt = kg.transpose(1, 2);  // [B, H, T, D]
      const auto q_embed = qt * cos + RotateHalf(qt) * sin;
      const auto k_embed = kt * cos + RotateHalf(kt) * sin;
      const auto grads = torch::autograd::grad({q_embed, k_embed}, {qg, kg}, {dq_t, dk_t});
      TORCH_CHECK(grads.size() == 2);
    };

    Row r;
    r.family = "rope";
    r.variant = "fwd+bwd";
    r.tokens = tokens;
    r.ours_us = TimeUs(ours, cfg);
    r.eager_us = TimeUs(eager, cfg);
    // Each of the four launches reads its input and writes its output once, and reads the fp32 tables.
    const double elems = static_cast<double>(tokens * (cfg.heads + cfg.kv_heads) * d);
    r.bytes = 4 * elems * esize + 4 * 2 * static_cast<double>(tokens * h) * 4;
    r.ours_peak_bytes = PeakBytes(ours);
    r.eager_peak_bytes = PeakBytes(eager);
    r.note = std::string(c10::toString(cfg.dtype)) + " q [1, " + std::to_string(tokens) + ", " +
             std::to_string(cfg.heads) + ", " + std::to_string(d) + "] + k [.., " + std::to_string(cfg.kv_heads) +
             ", ..]";
    rows.push_back(r);
  }
}

}  // namespace ftd::bench
