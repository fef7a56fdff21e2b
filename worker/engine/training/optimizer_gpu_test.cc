// The fused AdamW (ftd's multi-tensor kernel with the clipping folded in, kernel_set fused) against
// LibTorch's _fused_adamw_ (the eager set's step, the implementation behind
// torch.optim.AdamW(fused=True)), both driven through engine::AdamW as the trainer drives them: the
// same bf16 parameters and the same gradients, step after step, with and without fp32 master weights.
//
// Steps: two with clipping that binds (gradient norm ~100x the limit), one where it does not, one
// with found_inf set (nothing may change, bitwise, and the step count stays), two more that clip.
// Tensors: a projection at init scale (N(0, 0.02), decayed), an embedding of unit scale (decayed: decay
// moves it by lr * wd per step) and a norm weight near 1 (not decayed).
//
// Bounds, per element, after k applied steps (the two sides compute the same formula in a different
// order and precision, so each step may differ by rounding only):
//   fp32 masters: k * (2^-21 |w| + 2^-14 lr): fp32 rounding of the weight (2^-24 relative, a few
//     operations) and of the update (~2^-20 of lr); LibTorch takes the bias corrections in fp64, ftd
//     in fp32. A wrong bias correction, beta, decay or clip coefficient moves a weight by 1e-2 to 1 of
//     lr per step, 100x beyond.
//   bf16 weights and moments (no masters): k * (2^-7 |w| + 2^-4 lr): each side rounds the weight to
//     bf16 (one unit in the last place, <= 2^-7 |w|), and the eager side takes the gradient norm per
//     tensor in bf16 and scales the bf16 gradients by a bf16 coefficient (3 roundings of 2^-9), which
//     moves Adam's normalised update (|m/sqrt(v)| <= ~3) by at most ~2^-5 of lr; the moments' bf16
//     rounding adds as much.
//   bf16 weights with masters: one bf16 unit (2^-7 |w|) plus the masters' bound.
// The weights must also move by more than the bound on most elements (every master; the projection's
// bf16 weights), so that a step that does nothing cannot pass by being small.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/model/fused_ops.h"
#include "worker/engine/training/optimizer.h"

namespace ftd::engine {
namespace {

using Params = std::vector<std::pair<std::string, torch::Tensor>>;

constexpr double kLr = 1e-2;

Params InitialParams() {
  torch::manual_seed(7);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  return {{"model.layers.0.mlp.down_proj.weight", (0.02 * torch::randn({257, 129}, opts)).to(torch::kBFloat16)},
          {"model.embed_tokens.weight", torch::randn({300, 64}, opts).to(torch::kBFloat16)},
          {"model.norm.weight", (1 + 0.01 * torch::randn({129}, opts)).to(torch::kBFloat16)}};
}

Params Copy(const Params& ps) {
  Params out;
  for (const auto& [name, p] : ps) out.emplace_back(name, p.detach().clone().requires_grad_(true));
  return out;
}

struct Step {
  double grad_std;
  bool found_inf;
};

// Max over elements of |got - want| - bound (> 0: out of bounds), and the fraction of elements whose
// movement from `start` exceeds the bound.
struct Check {
  double worst_excess;
  double moved_fraction;
};
Check Compare(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& start, const torch::Tensor& bound) {
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble), s = start.to(torch::kDouble);
  return {((g - w).abs() - bound).max().item<double>(), ((w - s).abs() > bound).to(torch::kDouble).mean().item<double>()};
}

void RunAndCompare(bool master) {
  SCOPED_TRACE(master ? "fp32 master weights" : "bf16 weights and moments");
  OptimizerConfig cfg;
  cfg.lr = kLr;
  cfg.weight_decay = 0.1;
  cfg.grad_clip = 1.0;
  const Params init = InitialParams();
  Params pe = Copy(init), pf = Copy(init);
  AdamW eager(pe, cfg, master, /*fused=*/false), fused(pf, cfg, master, /*fused=*/true);
  const auto zero = torch::zeros({}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat));
  const std::vector<Step> steps = {{1.0, false}, {1.0, false}, {1e-4, false}, {1.0, true}, {0.3, false}, {0.3, false}};
  // Gradients share a direction from step to step (as a model's do over a few steps), so the weights
  // travel ~lr per step instead of a random walk, well beyond the bounds.
  torch::manual_seed(11);
  std::vector<torch::Tensor> direction;
  for (const auto& [name, p] : init) direction.push_back(torch::randn(p.sizes(), p.options().dtype(torch::kFloat)));
  int applied = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k + 1));
    std::vector<torch::Tensor> before, before_eager;
    for (const auto& [name, p] : pf) before.push_back(p.detach().clone());
    for (const auto& [name, p] : pe) before_eager.push_back(p.detach().clone());
    const auto found_inf = steps[k].found_inf ? torch::ones_like(zero) : zero;
    for (size_t i = 0; i < init.size(); ++i) {
      const auto g =
          (steps[k].grad_std * (direction[i] + 0.5 * torch::randn_like(direction[i]))).to(torch::kBFloat16);
      pe[i].second.mutable_grad() = g.clone();
      pf[i].second.mutable_grad() = g.clone();
    }
    for (AdamW* opt : {&eager, &fused}) {
      const auto norm = opt->GradNorm();
      opt->Clip(norm, cfg.grad_clip);
      opt->Step(kLr, found_inf);
      opt->ZeroGrad();
    }
    if (steps[k].found_inf) {  // skipped: bitwise unchanged, and the step count does not advance
      for (size_t i = 0; i < pf.size(); ++i) {
        EXPECT_TRUE(torch::equal(pf[i].second, before[i])) << "fused " << pf[i].first;
        EXPECT_TRUE(torch::equal(pe[i].second, before_eager[i])) << "eager " << pe[i].first;
      }
    } else {
      ++applied;
    }
    for (const auto& state : {eager.State(), fused.State()}) {
      for (const auto& [key, t] : state) {
        if (key.rfind("step.", 0) == 0) {
          EXPECT_EQ(static_cast<float>(applied), t.item<float>()) << key;
        }
      }
    }
  }
  torch::cuda::synchronize();

  // Masters (fp32) or, without them, the bf16 moments: the state under the same names on both sides.
  auto state_of = [](const AdamW& opt) {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& [key, t] : opt.State()) {
      if (key.rfind("step.", 0) != 0) out.emplace_back(key, t);
    }
    return out;
  };
  const auto se = state_of(eager), sf = state_of(fused);
  ASSERT_EQ(se.size(), sf.size());
  for (size_t i = 0; i < se.size(); ++i) {
    ASSERT_EQ(se[i].first, sf[i].first);
    if (se[i].first.rfind("master.", 0) != 0) continue;
    const auto w = se[i].second.to(torch::kDouble);
    const auto bound = applied * (std::ldexp(1.0, -21) * w.abs() + std::ldexp(kLr, -14));
    const auto& start = init[i / 3].second;  // State(): exp_avg, exp_avg_sq, master per parameter
    const Check c = Compare(sf[i].second, se[i].second, start, bound);
    EXPECT_LE(c.worst_excess, 0.0) << se[i].first;
    EXPECT_GT(c.moved_fraction, 0.9) << se[i].first;
  }
  for (size_t i = 0; i < init.size(); ++i) {
    const auto w = pe[i].second.detach().to(torch::kDouble).abs();
    const auto bound = master ? std::ldexp(1.0, -7) * w + applied * (std::ldexp(1.0, -21) * w + std::ldexp(kLr, -14))
                              : applied * (std::ldexp(1.0, -7) * w + std::ldexp(kLr, -4));
    const Check c = Compare(pf[i].second.detach(), pe[i].second.detach(), init[i].second, bound);
    EXPECT_LE(c.worst_excess, 0.0) << init[i].first;
    // Weights of order 1 move by ~5 lr in all, within their bf16 bound (2^-7 |w| a step): only the
    // projection (|w| ~ 0.02) must visibly move in bf16; every master is checked above.
    if (i == 0) {
      EXPECT_GT(c.moved_fraction, 0.5) << init[i].first;
    }
  }
}

TEST(AdamWGpu, FusedMatchesLibTorchFusedAdamW) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!fused::Available()) GTEST_SKIP() << "built without the CUDA kernels (nvcc absent)";
  RunAndCompare(/*master=*/false);
  RunAndCompare(/*master=*/true);
}

}  // namespace
}  // namespace ftd::engine
