// FP8 cast benchmark: our fused amax + cast (kernels/fp8_cast.h, one cooperative launch) against the
// eager LibTorch recipe (abs().amax(), the scale, multiply, clamp, cast to float8_e4m3fn), on
// activations [tokens, hidden] and [tokens, intermediate].
#include <ATen/cuda/CUDAContext.h>

#include <string>

#include "bench/kernels/bench.h"
#include "kernels/fp8_cast.h"

namespace ftd::bench {
namespace {

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

}  // namespace

void BenchFp8Cast(const BenchConfig& cfg, std::vector<Row>& rows) {
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const kernels::DType dt = cfg.dtype == torch::kFloat ? kernels::DType::kF32 : kernels::DType::kBF16;
  kernels::DeviceProps props;
  Ok(kernels::CurrentDeviceProps(&props), "CurrentDeviceProps");
  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  for (const int64_t width : {cfg.hidden, cfg.intermediate}) {
    for (const int64_t tokens : cfg.tokens) {
      const auto x = torch::randn({tokens, width}, opts);
      const int64_t n = x.numel();
      auto ours = [&] {
        auto out = torch::empty({tokens, width}, opts.dtype(torch::kFloat8_e4m3fn));
        auto s = torch::empty({2}, opts.dtype(torch::kFloat));
        Ok(kernels::Fp8CastAmax(props, dt, kernels::Fp8Format::kE4M3, x.data_ptr(), n,
                                static_cast<uint8_t*>(out.data_ptr()), s.data_ptr<float>(), s.data_ptr<float>() + 1,
                                at::cuda::getCurrentCUDAStream().stream()),
           "Fp8CastAmax");
      };
      auto eager = [&] {
        const auto amax = x.abs().amax().to(torch::kFloat);
        const auto scale = 448.0 / amax.clamp_min(1e-12);
        const auto out = (x.to(torch::kFloat) * scale).clamp(-448, 448).to(torch::kFloat8_e4m3fn);
        TORCH_CHECK(out.numel() == n);
      };
      Row r;
      r.family = "fp8_cast";
      r.variant = "amax+cast e4m3";
      r.tokens = tokens;
      r.ours_us = TimeUs(ours, cfg);
      r.eager_us = TimeUs(eager, cfg);
      r.bytes = static_cast<double>(n) * (esize + 1);  // x read once, one byte written per element
      r.ours_peak_bytes = PeakBytes(ours);
      r.eager_peak_bytes = PeakBytes(eager);
      r.note = std::string(c10::toString(cfg.dtype)) + " [" + std::to_string(tokens) + ", " + std::to_string(width) + "]";
      rows.push_back(r);
    }
  }
}

}  // namespace ftd::bench
