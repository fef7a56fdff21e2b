// The fp8 set's matmuls (worker/engine/model/fp8_ops.h) on the GPU:
//   - MatmulNT against an fp32 GEMM of the dequantized FP8 inputs: the wrapper's layouts and scales
//     exactly, so only the bf16 rounding of the output (2^-9 of each value) and the fp32 accumulation
//     order differ: max |err| / max |ref| <= 2^-7 (2^-10 with an fp32 output: the tensor cores
//     accumulate FP8 products in reduced precision between promotions to fp32);
//   - the same product against a bf16 GEMM of the original inputs: within FP8 rounding (E4M3 keeps 3
//     mantissa bits: each operand's relative rounding is uniform in +-2^-4, so a dot product's error is
//     ~0.05 of its typical size; bound 0.08 in relative Frobenius norm, and 0.13 with an E5M2 side);
//   - Linears (the autograd function of the q/k/v, gate/up and o/down projections), forward and
//     backward, against the same two references built from the recipe's description (the group's
//     output gradients in one E5M2 matrix, its weights stacked in one E4M3 matrix), with an odd token
//     count (padded rows), three projections of one input with unequal amax, and one left unused;
//   - NormLinears and SwiGluLinears (the norm's and SwiGLU's outputs written in E4M3 by their own kernel)
//     against the unfused composition (fused::RmsNorm / fused::SwiGlu in bf16, then Linears), forward
//     and backward: the same E4M3 operands but where the bf16 rounding of the unfused path moves a value
//     across an E4M3 rounding boundary (a few % of them, by one E4M3 step), so the outputs and dW agree
//     to ~1%, and the input gradients (from the same E5M2 gradient and E4M3 weights) to bf16 rounding;
//   - the weight cache: a weight's amax is kept through the step and found again after Invalidate().
// Compute capability below 8.9 has no FP8 GEMM: the test skips there.
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "worker/engine/model/fp8_ops.h"
#include "worker/engine/model/fused_ops.h"

namespace ftd::engine::fp8 {
namespace {

bool HaveFp8Gpu() {
  if (!torch::cuda::is_available()) return false;
  const auto* p = at::cuda::getCurrentDeviceProperties();
  return p->major * 10 + p->minor >= 89;
}

torch::Tensor Dequant(const Fp8Tensor& t) { return t.data.to(torch::kFloat) * t.scale_inv; }

double MaxRel(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got.to(torch::kFloat) - want.to(torch::kFloat)).abs().max() / want.to(torch::kFloat).abs().max()).item<double>();
}
double FrobRel(const torch::Tensor& got, const torch::Tensor& want) {
  const auto w = want.to(torch::kFloat);
  return ((got.to(torch::kFloat) - w).norm() / w.norm()).item<double>();
}

torch::TensorOptions Bf16() { return torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA); }

TEST(Fp8OpsGpu, QuantizeRoundTrip) {
  if (!HaveFp8Gpu()) GTEST_SKIP() << "no GPU with FP8 (compute capability 8.9+)";
  auto x = torch::randn({333, 77}, Bf16()) * 5;
  for (auto dtype : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2}) {
    const Fp8Tensor q = Quantize(x, dtype);
    ASSERT_EQ(q.data.scalar_type(), dtype);
    ASSERT_EQ(q.data.sizes(), x.sizes());
    const double amax = x.abs().max().item<double>(), fmax = dtype == torch::kFloat8_e4m3fn ? 448 : 57344;
    EXPECT_FLOAT_EQ(q.scale_inv.item<float>(), 1.f / static_cast<float>(fmax / static_cast<float>(amax)));
    // Each value within half a unit of its format's precision (2^-4 E4M3, 2^-3 E5M2) or of the
    // smallest subnormal step.
    const double u = dtype == torch::kFloat8_e4m3fn ? 1.0 / 16 : 1.0 / 8;
    const auto err = (Dequant(q) - x.to(torch::kFloat)).abs();
    const auto bound = x.to(torch::kFloat).abs() * u + q.scale_inv * 0.01;
    EXPECT_TRUE(err.le(bound).all().item<bool>()) << "max err " << err.max().item<double>();
  }
}

TEST(Fp8OpsGpu, MatmulMatchesDequantizedGemmAndBf16WithinFp8Rounding) {
  if (!HaveFp8Gpu()) GTEST_SKIP() << "no GPU with FP8 (compute capability 8.9+)";
  struct Shape {
    int64_t m, k, n;
  };
  for (const Shape s : {Shape{64, 128, 256}, Shape{2048, 4096, 1024}, Shape{48, 14336, 4096}}) {
    auto a = torch::randn({s.m, s.k}, Bf16()), b = torch::randn({s.n, s.k}, Bf16()) * 0.02;
    for (auto adt : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2}) {
      const std::string name = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n) +
                               (adt == torch::kFloat8_e5m2 ? " e5m2 x e4m3" : " e4m3 x e4m3");
      const Fp8Tensor a8 = Quantize(a, adt), b8 = Quantize(b, torch::kFloat8_e4m3fn);
      const auto got = MatmulNT(a8, b8, torch::kBFloat16);
      ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
      ASSERT_EQ(got.sizes(), (std::vector<int64_t>{s.m, s.n}));
      EXPECT_LE(MaxRel(got, torch::mm(Dequant(a8), Dequant(b8).t())), 1.0 / 128) << name;
      EXPECT_LE(FrobRel(got, torch::mm(a, b.t())), adt == torch::kFloat8_e4m3fn ? 0.08 : 0.13) << name;
      // fp32 output: the same product without the bf16 rounding.
      EXPECT_LE(MaxRel(MatmulNT(a8, b8, torch::kFloat), torch::mm(Dequant(a8), Dequant(b8).t())), 1.0 / 1024) << name;
    }
  }
}

// Linears on q/k/v-like widths; `used` says which outputs the loss reads (an unused one gets no
// gradient: its block of the stacked dW is zero and it adds nothing to dx).
void CheckLinears(const std::vector<bool>& used) {
  // [3, 37] tokens (111 rows: padded to 112 inside), hidden 256, q/k/v widths 256, 64, 64.
  auto x = (torch::randn({3, 37, 256}, Bf16())).requires_grad_(true);
  std::vector<torch::Tensor> ws;
  for (int64_t n : {256, 64, 64}) ws.push_back((torch::randn({n, 256}, Bf16()) * 0.02).requires_grad_(true));
  ws[1].detach().mul_(3);  // unequal amax: the stacked weights' one scale is the largest
  WeightCache cache;
  auto ys = Linears(x, ws, &cache);
  ASSERT_EQ(ys.size(), 3u);
  std::vector<torch::Tensor> dys;
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA));
  for (size_t i = 0; i < ys.size(); ++i) {
    ASSERT_EQ(ys[i].sizes(), (std::vector<int64_t>{3, 37, ws[i].size(0)}));
    dys.push_back(used[i] ? torch::randn(ys[i].sizes(), Bf16()) * (1.0 + static_cast<double>(i))
                          : torch::zeros(ys[i].sizes(), Bf16()));
    if (used[i]) loss = loss + (ys[i].to(torch::kFloat) * dys[i].to(torch::kFloat)).sum();
  }
  loss.backward();

  // The recipe, from its description: x and each W in E4M3 with their own scales (forward); the output
  // gradients side by side in one E5M2 matrix with one scale, the weights stacked in one E4M3 matrix
  // with one scale (backward); dx = G [W_q; W_k; W_v], [dW_q; dW_k; dW_v] = G^T x.
  const auto x2 = x.detach().reshape({111, 256});
  const Fp8Tensor x8 = Quantize(x2, torch::kFloat8_e4m3fn);
  std::vector<torch::Tensor> dy2;
  for (const auto& d : dys) dy2.push_back(d.reshape({111, -1}));
  const auto dy_cat = torch::cat(dy2, 1);
  const Fp8Tensor g8 = Quantize(dy_cat, torch::kFloat8_e5m2);
  std::vector<torch::Tensor> wd;
  for (const auto& w : ws) wd.push_back(w.detach());
  const Fp8Tensor w_cat8 = Quantize(torch::cat(wd, 0), torch::kFloat8_e4m3fn);
  const auto want_dx = torch::mm(Dequant(g8), Dequant(w_cat8));
  const auto bf16_dx = torch::mm(dy_cat, torch::cat(wd, 0)).to(torch::kFloat);
  const auto want_dw = torch::mm(Dequant(g8).t(), Dequant(x8));
  int64_t at = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const std::string name = "projection " + std::to_string(i) + (used[i] ? "" : " (unused)");
    const int64_t n = ws[i].size(0);
    const Fp8Tensor w8 = Quantize(wd[i], torch::kFloat8_e4m3fn);
    const auto y = ys[i].detach().reshape({111, -1});
    EXPECT_LE(MaxRel(y, torch::mm(Dequant(x8), Dequant(w8).t())), 1.0 / 128) << "y, " << name;
    EXPECT_LE(FrobRel(y, torch::mm(x2, wd[i].t())), 0.08) << "y vs bf16, " << name;
    ASSERT_TRUE(ws[i].grad().defined()) << name;
    if (used[i]) {
      EXPECT_LE(MaxRel(ws[i].grad(), want_dw.narrow(0, at, n)), 1.0 / 128) << "dW, " << name;
      EXPECT_LE(FrobRel(ws[i].grad(), torch::mm(dy2[i].t(), x2)), 0.13) << "dW vs bf16, " << name;
    } else {
      EXPECT_EQ(ws[i].grad().abs().max().item<float>(), 0.f) << "dW, " << name;
    }
    at += n;
  }
  ASSERT_TRUE(x.grad().defined());
  EXPECT_LE(MaxRel(x.grad().reshape({111, 256}), want_dx), 1.0 / 128) << "dx";
  EXPECT_LE(FrobRel(x.grad().reshape({111, 256}), bf16_dx), 0.13) << "dx vs bf16";
}

TEST(Fp8OpsGpu, LinearsForwardAndBackward) {
  if (!HaveFp8Gpu()) GTEST_SKIP() << "no GPU with FP8 (compute capability 8.9+)";
  CheckLinears({true, true, true});
  CheckLinears({true, false, true});
}

// Runs `fused` and `unfused` (each: inputs -> outputs) on copies of `inputs` and `weights` with the
// same output gradients; compares outputs, weight gradients and input gradients.
void CompareWithUnfused(const std::string& name, const std::vector<torch::Tensor>& inputs,
                        const std::vector<torch::Tensor>& weights,
                        const std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&,
                                                                       const std::vector<torch::Tensor>&)>& fused,
                        const std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&,
                                                                       const std::vector<torch::Tensor>&)>& unfused) {
  auto leaves = [](const std::vector<torch::Tensor>& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& t : ts) out.push_back(t.detach().clone().requires_grad_(true));
    return out;
  };
  const auto in_a = leaves(inputs), w_a = leaves(weights), in_b = leaves(inputs), w_b = leaves(weights);
  const auto ya = fused(in_a, w_a), yb = unfused(in_b, w_b);
  ASSERT_EQ(ya.size(), yb.size()) << name;
  torch::Tensor la = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA)), lb = la;
  for (size_t i = 0; i < ya.size(); ++i) {
    ASSERT_EQ(ya[i].sizes(), yb[i].sizes()) << name;
    EXPECT_LE(FrobRel(ya[i], yb[i]), 0.02) << "output " << i << ", " << name;
    const auto dy = torch::randn(ya[i].sizes(), Bf16());
    la = la + (ya[i].to(torch::kFloat) * dy.to(torch::kFloat)).sum();
    lb = lb + (yb[i].to(torch::kFloat) * dy.to(torch::kFloat)).sum();
  }
  la.backward();
  lb.backward();
  for (size_t i = 0; i < w_a.size(); ++i) {
    ASSERT_TRUE(w_a[i].grad().defined()) << "weight " << i << ", " << name;
    EXPECT_LE(FrobRel(w_a[i].grad(), w_b[i].grad()), 0.02) << "weight gradient " << i << ", " << name;
  }
  for (size_t i = 0; i < in_a.size(); ++i) {
    ASSERT_TRUE(in_a[i].grad().defined()) << "input " << i << ", " << name;
    EXPECT_LE(FrobRel(in_a[i].grad(), in_b[i].grad()), 0.01) << "input gradient " << i << ", " << name;
  }
}

TEST(Fp8OpsGpu, NormAndSwiGluWithTheCastFusedMatchTheUnfusedPath) {
  if (!HaveFp8Gpu()) GTEST_SKIP() << "no GPU with FP8 (compute capability 8.9+)";
  const double eps = 1e-5;
  // [3, 37] tokens (111 rows: padded to 112 inside), hidden 256; q/k/v widths 256, 64, 64.
  const auto x = torch::randn({3, 37, 256}, Bf16()) * 3;
  std::vector<torch::Tensor> weights = {torch::rand({256}, Bf16()) + 0.5};  // the norm's weight, then q, k, v
  for (int64_t n : {256, 64, 64}) weights.push_back(torch::randn({n, 256}, Bf16()) * 0.02);
  CompareWithUnfused(
      "norm + q/k/v", {x}, weights,
      [&](const std::vector<torch::Tensor>& in, const std::vector<torch::Tensor>& w) {
        WeightCache cache;
        return NormLinears(in[0], w[0], eps, {w.begin() + 1, w.end()}, &cache);
      },
      [&](const std::vector<torch::Tensor>& in, const std::vector<torch::Tensor>& w) {
        WeightCache cache;
        return Linears(fused::RmsNorm(in[0], w[0], eps), {w.begin() + 1, w.end()}, &cache);
      });
  // SwiGLU into down: intermediate 512 -> hidden 256.
  const auto gate = torch::randn({3, 37, 512}, Bf16()) * 2, up = torch::randn({3, 37, 512}, Bf16());
  CompareWithUnfused(
      "swiglu + down", {gate, up}, {torch::randn({256, 512}, Bf16()) * 0.02},
      [&](const std::vector<torch::Tensor>& in, const std::vector<torch::Tensor>& w) {
        WeightCache cache;
        return SwiGluLinears(in[0], in[1], w, &cache);
      },
      [&](const std::vector<torch::Tensor>& in, const std::vector<torch::Tensor>& w) {
        WeightCache cache;
        return Linears(fused::SwiGlu(in[0], in[1]), w, &cache);
      });
}

TEST(Fp8OpsGpu, WeightCacheKeepsTheAmaxUntilInvalidate) {
  if (!HaveFp8Gpu()) GTEST_SKIP() << "no GPU with FP8 (compute capability 8.9+)";
  torch::NoGradGuard no_grad;
  auto x = torch::randn({16, 64}, Bf16());
  auto w = torch::randn({32, 64}, Bf16());
  WeightCache cache;
  const auto before = Linears(x, {w}, &cache)[0].clone();
  const float amax = cache.Stats(w)[0].item<float>();
  EXPECT_EQ(amax, w.abs().max().item<float>());
  w.mul_(0.5);  // in place, as the optimizer writes
  const auto same_step = Linears(x, {w}, &cache)[0];
  EXPECT_EQ(cache.Stats(w)[0].item<float>(), amax) << "the step's amax is kept until invalidated";
  // Scaled by the old amax the halved weight uses half the E4M3 range: the result is still its product.
  EXPECT_LE(FrobRel(same_step, before * 0.5), 0.08);
  cache.Invalidate();
  const auto after = Linears(x, {w}, &cache)[0];
  EXPECT_EQ(cache.Stats(w)[0].item<float>(), w.abs().max().item<float>()) << "the amax is found again after Invalidate";
  EXPECT_LE(FrobRel(after, before * 0.5), 0.08);
}

}  // namespace
}  // namespace ftd::engine::fp8
