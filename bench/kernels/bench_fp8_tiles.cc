// FP8 tile casts benchmark (kernels/fp8_tiles.h) against what the fp8 set did before them, on the
// LLaMA-3.1-8B projection shapes:
//   - the byte transpose of an E4M3 activation [tokens, hidden] (the dW GEMM's x^T) against LibTorch's
//     t().contiguous() on the bytes;
//   - the output gradients of q/k/v [tokens, 4096 | 1024 | 1024] into one E5M2 matrix and its transpose
//     (amax and both layouts in one cooperative launch) against three amax+casts (Fp8CastAmax) and three
//     byte transposes;
//   - the stacked q/k/v weights [6144, 4096] cast with a given amax straight into the transposed layout
//     against a cast (Fp8CastAmax) and a byte transpose.
#include <ATen/cuda/CUDAContext.h>

#include <functional>
#include <string>

#include "bench/kernels/bench.h"
#include "kernels/fp8_cast.h"
#include "kernels/fp8_tiles.h"

namespace ftd::bench {
namespace {

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }
uint8_t* U8(const torch::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }

}  // namespace

void BenchFp8Tiles(const BenchConfig& cfg, std::vector<Row>& rows) {
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const auto f8 = opts.dtype(torch::kFloat8_e4m3fn);
  const kernels::DType dt = cfg.dtype == torch::kFloat ? kernels::DType::kF32 : kernels::DType::kBF16;
  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  kernels::DeviceProps props;
  Ok(kernels::CurrentDeviceProps(&props), "CurrentDeviceProps");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  const int64_t q = cfg.heads * cfg.head_dim, kv = cfg.kv_heads * cfg.head_dim, qkv = q + 2 * kv;
  auto stats = [&] { return torch::empty({8}, opts.dtype(torch::kFloat)); };
  auto add = [&](const char* variant, int64_t tokens, const std::function<void()>& ours,
                 const std::function<void()>& before, double bytes, const std::string& note) {
    Row r;
    r.family = "fp8_tiles";
    r.variant = variant;
    r.tokens = tokens;
    r.ours_us = TimeUs(ours, cfg);
    r.eager_us = TimeUs(before, cfg);
    r.bytes = bytes;
    r.ours_peak_bytes = PeakBytes(ours);
    r.eager_peak_bytes = PeakBytes(before);
    r.note = note;
    rows.push_back(r);
  };
  for (const int64_t tokens : cfg.tokens) {
    // The byte transpose of x8 [tokens, hidden].
    const auto x8 = torch::randn({tokens, cfg.hidden}, opts).to(torch::kFloat8_e4m3fn);
    add("transpose e4m3", tokens,
        [&] {
          auto o = torch::empty({cfg.hidden, tokens}, f8);
          Ok(kernels::Fp8Transpose(props, U8(x8), tokens, cfg.hidden, U8(o), stream), "Fp8Transpose");
        },
        [&] { (void)x8.view(torch::kUInt8).t().contiguous(); }, 2.0 * static_cast<double>(x8.numel()),
        "[" + std::to_string(tokens) + ", " + std::to_string(cfg.hidden) + "] bytes, vs t().contiguous()");

    // q/k/v output gradients -> one E5M2 matrix and its transpose.
    const auto gq = torch::randn({tokens, q}, opts), gk = torch::randn({tokens, kv}, opts),
               gv = torch::randn({tokens, kv}, opts);
    add("q/k/v grads -> e5m2 + transposed", tokens,
        [&] {
          auto o = torch::empty({tokens, qkv}, f8), ot = torch::empty({qkv, tokens}, f8), s = stats();
          kernels::Fp8TileCast p;
          p.dtype = dt;
          p.format = kernels::Fp8Format::kE5M2;
          p.num_sources = 3;
          p.sources[0] = {gq.data_ptr(), tokens, q, q};
          p.sources[1] = {gk.data_ptr(), tokens, kv, kv};
          p.sources[2] = {gv.data_ptr(), tokens, kv, kv};
          p.out = U8(o);
          p.out_t = U8(ot);
          p.amax = s.data_ptr<float>();
          p.scale_inv = s.data_ptr<float>() + 4;
          Ok(kernels::Fp8CastTiles(props, p, stream), "Fp8CastTiles");
        },
        [&] {
          for (const auto* g : {&gq, &gk, &gv}) {
            auto o = torch::empty(g->sizes(), f8), s = stats();
            Ok(kernels::Fp8CastAmax(props, dt, kernels::Fp8Format::kE5M2, g->data_ptr(), g->numel(), U8(o),
                                    s.data_ptr<float>(), s.data_ptr<float>() + 4, stream),
               "Fp8CastAmax");
            (void)o.view(torch::kUInt8).t().contiguous();
          }
        },
        static_cast<double>(tokens * qkv) * (esize + 2),
        std::string(c10::toString(cfg.dtype)) + " [" + std::to_string(tokens) + ", " + std::to_string(qkv) +
            "], vs 3 x (amax+cast, t().contiguous())");
  }
  // The stacked q/k/v weights, given amax -> transposed E4M3 (once: no token dimension).
  const auto wq = torch::randn({q, cfg.hidden}, opts) * 0.02, wk = torch::randn({kv, cfg.hidden}, opts) * 0.02,
             wv = torch::randn({kv, cfg.hidden}, opts) * 0.02;
  const auto amax = torch::full({1}, 0.1f, opts.dtype(torch::kFloat));
  add("q/k/v weights -> e4m3 transposed", 0,
      [&] {
        auto ot = torch::empty({cfg.hidden, qkv}, f8), s = stats();
        kernels::Fp8TileCast p;
        p.dtype = dt;
        p.concat = kernels::Fp8Concat::kRows;
        p.scale_from = kernels::Fp8ScaleFrom::kGiven;
        p.num_sources = 3;
        const float* a = amax.data_ptr<float>();
        p.sources[0] = {wq.data_ptr(), q, cfg.hidden, cfg.hidden, a};
        p.sources[1] = {wk.data_ptr(), kv, cfg.hidden, cfg.hidden, a};
        p.sources[2] = {wv.data_ptr(), kv, cfg.hidden, cfg.hidden, a};
        p.out_t = U8(ot);
        p.amax = s.data_ptr<float>();
        p.scale_inv = s.data_ptr<float>() + 4;
        Ok(kernels::Fp8CastTiles(props, p, stream), "Fp8CastTiles");
      },
      [&] {
        for (const auto* w : {&wq, &wk, &wv}) {
          auto o = torch::empty(w->sizes(), f8), s = stats();
          Ok(kernels::Fp8CastAmax(props, dt, kernels::Fp8Format::kE4M3, w->data_ptr(), w->numel(), U8(o),
                                  s.data_ptr<float>(), s.data_ptr<float>() + 4, stream),
             "Fp8CastAmax");
          (void)o.view(torch::kUInt8).t().contiguous();
        }
      },
      static_cast<double>(qkv * cfg.hidden) * (esize + 1),
      std::string(c10::toString(cfg.dtype)) + " [" + std::to_string(qkv) + ", " + std::to_string(cfg.hidden) +
          "], vs 3 x (amax+cast, t().contiguous())");
}

}  // namespace ftd::bench
