// SwiGLU benchmark: our fused forward + backward (kernels/swiglu.h) against eager silu(gate) * up,
// forward + backward through autograd, on gate and up of [tokens, intermediate].
#include <ATen/cuda/CUDAContext.h>

#include <string>

#include "bench/kernels/bench.h"
#include "kernels/swiglu.h"

namespace ftd::bench {
namespace {

kernels::DType KDType(torch::ScalarType t) { return t == torch::kFloat ? kernels::DType::kF32 : kernels::DType::kBF16; }

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

}  // namespace

void BenchSwiGlu(const BenchConfig& cfg, std::vector<Row>& rows) {
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const int64_t m = cfg.intermediate;
  const kernels::DType dt = KDType(cfg.dtype);
  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  for (const int64_t tokens : cfg.tokens) {
    const auto gate = torch::randn({tokens, m}, opts);
    const auto up = torch::randn({tokens, m}, opts);
    const auto dout = torch::randn({tokens, m}, opts);
    const int64_t n = tokens * m;

    auto ours = [&] {
      const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
      auto out = torch::empty({tokens, m}, opts);
      auto dgate = torch::empty({tokens, m}, opts);
      auto dup = torch::empty({tokens, m}, opts);
      Ok(kernels::SwiGluForward(dt, gate.data_ptr(), up.data_ptr(), out.data_ptr(), n, stream), "SwiGluForward");
      Ok(kernels::SwiGluBackward(dt, dout.data_ptr(), gate.data_ptr(), up.data_ptr(), dgate.data_ptr(), dup.data_ptr(),
                                 n, stream),
         "SwiGluBackward");
    };

    const auto gg = gate.detach().requires_grad_(true), ug = up.detach().requires_grad_(true);
    auto eager = [&] {
      const auto out = torch::silu(gg) * ug;
      const auto grads = torch::autograd::grad({out}, {gg, ug}, {dout});
      TORCH_CHECK(grads.size() == 2);
    };

    Row r;
    r.family = "swiglu";
    r.variant = "fwd+bwd";
    r.tokens = tokens;
    r.ours_us = TimeUs(ours, cfg);
    r.eager_us = TimeUs(eager, cfg);
    // Forward: gate, up read, out written. Backward: dout, gate, up read, dgate, dup written.
    r.bytes = 8 * static_cast<double>(n) * esize;
    r.ours_peak_bytes = PeakBytes(ours);
    r.eager_peak_bytes = PeakBytes(eager);
    r.note = std::string(c10::toString(cfg.dtype)) + " [" + std::to_string(tokens) + ", " + std::to_string(m) + "]";
    rows.push_back(r);
  }
}

}  // namespace ftd::bench
