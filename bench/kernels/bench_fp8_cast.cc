// FP8 cast benchmark: our fused amax + cast (kernels/fp8_cast.h, one cooperative launch) against the
// eager LibTorch recipe (abs().amax(), the scale, multiply, clamp, cast to float8_e4m3fn), on
// activations [tokens, hidden] and [tokens, intermediate]. Then the casts fused into their producers
// (RmsNormFp8 on [tokens, hidden], SwiGluFp8 on [tokens, intermediate]) against the producer's kernel
// writing bf16 followed by the cast kernel (the "eager" column of those rows: our two kernels, unfused).
#include <ATen/cuda/CUDAContext.h>

#include <functional>
#include <string>

#include "bench/kernels/bench.h"
#include "kernels/fp8_cast.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"

namespace ftd::bench {
namespace {

void Ok(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

// The fused casts against producer (bf16 out) + Fp8CastAmax: time, and the bytes the fused launch moves
// at the least (its inputs read once, one byte written per element).
void BenchFusedCasts(const BenchConfig& cfg, const kernels::DeviceProps& props, kernels::DType dt,
                     std::vector<Row>& rows) {
  const auto opts = torch::TensorOptions().dtype(cfg.dtype).device(torch::kCUDA);
  const double esize = static_cast<double>(torch::elementSize(cfg.dtype));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  kernels::RmsNormPlan plan;
  Ok(kernels::PlanRmsNorm(props, dt, cfg.hidden, &plan), "PlanRmsNorm");
  for (const int64_t tokens : cfg.tokens) {
    const auto x = torch::randn({tokens, cfg.hidden}, opts), w = torch::rand({cfg.hidden}, opts) + 0.5;
    const auto gate = torch::randn({tokens, cfg.intermediate}, opts), up = torch::randn({tokens, cfg.intermediate}, opts);
    auto out8 = [&](int64_t width) { return torch::empty({tokens, width}, opts.dtype(torch::kFloat8_e4m3fn)); };
    auto stats = [&] { return torch::empty({2}, opts.dtype(torch::kFloat)); };
    auto u8 = [](const torch::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); };
    const auto e4m3 = kernels::Fp8Format::kE4M3;
    auto norm_fused = [&] {
      auto o = out8(cfg.hidden), s = stats();
      auto rstd = torch::empty({tokens}, opts.dtype(torch::kFloat));
      Ok(kernels::RmsNormFp8(props, dt, e4m3, x.data_ptr(), w.data_ptr(), tokens, cfg.hidden, 1e-5f,
                             rstd.data_ptr<float>(), u8(o), s.data_ptr<float>(), s.data_ptr<float>() + 1, stream),
         "RmsNormFp8");
    };
    auto norm_then_cast = [&] {
      auto y = torch::empty_like(x), o = out8(cfg.hidden), s = stats();
      auto rstd = torch::empty({tokens}, opts.dtype(torch::kFloat));
      Ok(kernels::RmsNormForward(plan, x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), tokens, 1e-5f,
                                 stream),
         "RmsNormForward");
      Ok(kernels::Fp8CastAmax(props, dt, e4m3, y.data_ptr(), y.numel(), u8(o), s.data_ptr<float>(),
                              s.data_ptr<float>() + 1, stream),
         "Fp8CastAmax");
    };
    auto swiglu_fused = [&] {
      auto o = out8(cfg.intermediate), s = stats();
      Ok(kernels::SwiGluFp8(props, dt, e4m3, gate.data_ptr(), up.data_ptr(), gate.numel(), u8(o), s.data_ptr<float>(),
                            s.data_ptr<float>() + 1, stream),
         "SwiGluFp8");
    };
    auto swiglu_then_cast = [&] {
      auto y = torch::empty_like(gate), o = out8(cfg.intermediate), s = stats();
      Ok(kernels::SwiGluForward(dt, gate.data_ptr(), up.data_ptr(), y.data_ptr(), gate.numel(), stream),
         "SwiGluForward");
      Ok(kernels::Fp8CastAmax(props, dt, e4m3, y.data_ptr(), y.numel(), u8(o), s.data_ptr<float>(),
                              s.data_ptr<float>() + 1, stream),
         "Fp8CastAmax");
    };
    struct Case {
      const char* variant;
      std::function<void()> fused, unfused;
      double bytes;
      int64_t width;
    };
    const double nh = static_cast<double>(x.numel()), ni = static_cast<double>(gate.numel());
    for (const Case& c : {Case{"rmsnorm+cast e4m3", norm_fused, norm_then_cast, nh * (esize + 1), cfg.hidden},
                          Case{"swiglu+cast e4m3", swiglu_fused, swiglu_then_cast, ni * (2 * esize + 1),
                               cfg.intermediate}}) {
      Row r;
      r.family = "fp8_cast";
      r.variant = c.variant;
      r.tokens = tokens;
      r.ours_us = TimeUs(c.fused, cfg);
      r.eager_us = TimeUs(c.unfused, cfg);
      r.bytes = c.bytes;
      r.ours_peak_bytes = PeakBytes(c.fused);
      r.eager_peak_bytes = PeakBytes(c.unfused);
      r.note = std::string(c10::toString(cfg.dtype)) + " [" + std::to_string(tokens) + ", " + std::to_string(c.width) +
               "], vs our producer in bf16 then the cast";
      rows.push_back(r);
    }
  }
}

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
  BenchFusedCasts(cfg, props, dt, rows);
}

}  // namespace ftd::bench
