// The LoRA op (lora.h): one adapted projection, x W^T + scale (dropout(x) A^T) B^T, and the grouped
// autograd function that applies several projections sharing one input in one pass. Adapters'
// names and files (PEFT's format) are in lora_peft.cc.
#include "worker/engine/model/lora.h"

#include <algorithm>
#include <cmath>

#include "worker/engine/torch_util.h"

namespace ftd::engine {

torch::Tensor LoraLinear(const torch::Tensor& x, const torch::Tensor& w, const LoraAdapter& ad, double scale,
                         double dropout, bool train) {
  auto y = torch::linear(x, w);
  if (!ad.on()) return y;
  auto xa = x.to(ad.a.scalar_type());
  if (dropout > 0 && train) xa = torch::dropout(xa, dropout, /*train=*/true);
  auto delta = torch::linear(torch::linear(xa, ad.a), ad.b) * scale;
  return (y + delta).to(y.scalar_type());
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Mixed precision (a bf16 base, fp32 adapters): the adapters' small GEMMs take fp32 operands as a
// bf16 pair hi + lo (hi = bf16(v), lo = bf16(v - hi): about 16 mantissa bits) and write fp32, so the
// rank-sized activations and the adapters' gradients keep what PEFT's fp32 path keeps, while x and
// the base GEMMs stay bf16. These GEMMs are [N, rank]- or [rank, in]-sized: a few percent of a
// layer's base GEMMs.
struct Split {
  torch::Tensor hi, lo;  // lo undefined: hi is exact (no mixed precision)
};

Split SplitTo(const torch::Tensor& v, torch::ScalarType dt, bool mixed) {
  Split s;
  s.hi = v.to(dt).contiguous();
  if (mixed) s.lo = (v - s.hi.to(v.scalar_type())).to(dt).contiguous();
  return s;
}

// a b (a: [m, k] in the base dtype) in fp32: hi and lo products accumulated; without mixed
// precision a plain product in the operands' dtype.
torch::Tensor MmSplit(const torch::Tensor& a, const Split& b, bool b_transposed) {
  auto bh = b_transposed ? b.hi.t() : b.hi;
  if (!b.lo.defined()) return torch::mm(a, bh);
  auto out = at::mm(a, bh, torch::kFloat);
  return out.add_(at::mm(a, b_transposed ? b.lo.t() : b.lo, torch::kFloat));
}
torch::Tensor MmSplitLeft(const Split& a, const torch::Tensor& b) {  // a^T b with a [k, m]
  if (!a.lo.defined()) return torch::mm(a.hi.t(), b);
  auto out = at::mm(a.hi.t(), b, torch::kFloat);
  return out.add_(at::mm(a.lo.t(), b, torch::kFloat));
}

// Inputs (flattened by LibTorch): x, then n weights, n A, n B; outputs: n projections.
struct LoraGroupFn : public torch::autograd::Function<LoraGroupFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList ws, at::TensorList as,
                               at::TensorList bs, double scale) {
    const int64_t n = static_cast<int64_t>(ws.size()), in = x.size(-1);
    auto x2 = x.reshape({-1, in});
    const auto dt = x.scalar_type();
    const auto adt = as[0].scalar_type();
    // fp32 adapters on a bf16 base, on a GPU (the CPU has no bf16 x bf16 -> fp32 GEMM; there the
    // adapters are cast to the base's dtype).
    const bool mixed = adt == torch::kFloat && dt != torch::kFloat && x.is_cuda();
    const Split a = SplitTo(torch::cat(std::vector<torch::Tensor>(as.begin(), as.end()), 0), dt, mixed);  // [R, in]
    auto u = MmSplit(x2, a, /*b_transposed=*/true);  // [N, R], fp32 when mixed
    const Split us = SplitTo(u, dt, mixed);
    variable_list out;
    auto shape = x.sizes().vec();
    int64_t off = 0;
    std::vector<int64_t> ranks;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = as[i].size(0);
      auto y = torch::mm(x2, ws[i].t());
      // The adapter's term in the GEMM's epilogue. Mixed: u B^T ~ u_hi B_hi^T + u_lo B_hi^T + u_hi B_lo^T
      // as one GEMM over the concatenated rank (3r): one pass over y, as for r.
      const Split bsplit = SplitTo(bs[i], dt, mixed);
      auto ui = us.hi.narrow(1, off, r);
      if (mixed) {
        auto u3 = torch::cat({ui, us.lo.narrow(1, off, r), ui}, 1);
        auto b3 = torch::cat({bsplit.hi, bsplit.hi, bsplit.lo}, 1);
        y.addmm_(u3, b3.t(), /*beta=*/1, /*alpha=*/scale);
      } else {
        y.addmm_(ui, bsplit.hi.t(), /*beta=*/1, /*alpha=*/scale);
      }
      shape.back() = ws[i].size(0);
      out.push_back(y.view(shape));
      ranks.push_back(r);
      off += r;
    }
    variable_list saved = {x2, u, a.hi, a.lo};
    for (int64_t i = 0; i < n; ++i) saved.push_back(ws[i]);
    for (int64_t i = 0; i < n; ++i) saved.push_back(bs[i]);
    ctx->save_for_backward(saved);
    ctx->saved_data["n"] = n;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["mixed"] = mixed;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["ranks"] = ranks;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const int64_t n = ctx->saved_data["n"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const bool mixed = ctx->saved_data["mixed"].toBool();
    const auto ranks = ctx->saved_data["ranks"].toIntVector();
    const auto& x2 = saved[0];
    const auto& u = saved[1];
    const Split a{saved[2], saved[3]};
    const auto dt = x2.scalar_type();
    auto w = [&](int64_t i) -> const torch::Tensor& { return saved[4 + i]; };
    auto b = [&](int64_t i) -> const torch::Tensor& { return saved[4 + n + i]; };
    std::vector<torch::Tensor> dy;
    for (int64_t i = 0; i < n; ++i) dy.push_back(grads[i].reshape({x2.size(0), -1}));
    // The adapters' gradient at their rank-sized bottleneck: g_i = scale * dy_i B_i.
    std::vector<torch::Tensor> g;
    for (int64_t i = 0; i < n; ++i) g.push_back(MmSplit(dy[i], SplitTo(b(i), dt, mixed), /*b_transposed=*/false));
    auto g_cat = torch::cat(g, 1).mul_(scale);  // [N, R]
    const Split gs = SplitTo(g_cat, dt, mixed);
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = torch::mm(dy[0], w(0));
      for (int64_t i = 1; i < n; ++i) dx.addmm_(dy[i], w(i));
      if (mixed) {  // G A ~ G_hi A_hi + G_lo A_hi + G_hi A_lo, one GEMM over 3R
        dx.addmm_(torch::cat({gs.hi, gs.lo, gs.hi}, 1), torch::cat({a.hi, a.hi, a.lo}, 0));
      } else {
        dx.addmm_(gs.hi, a.hi);
      }
      dx = dx.view(ctx->saved_data["x_shape"].toIntVector());
    }
    auto da_cat = MmSplitLeft(gs, x2);  // [R, in]
    variable_list out = {dx};
    for (int64_t i = 0; i < n; ++i) out.emplace_back();  // frozen weights
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
      out.push_back(da_cat.narrow(0, off, ranks[i]).to(b(i).scalar_type()));
      off += ranks[i];
    }
    off = 0;
    for (int64_t i = 0; i < n; ++i) {
      const Split ui = SplitTo(u.narrow(1, off, ranks[i]), dt, mixed);
      auto db = mixed ? MmSplit(dy[i].t(), Split{ui.hi, ui.lo}, false) : torch::mm(dy[i].t(), ui.hi);
      out.push_back(db.mul_(scale).to(b(i).scalar_type()));
      off += ranks[i];
    }
    out.emplace_back();  // scale
    return out;
  }
};

}  // namespace

std::vector<torch::Tensor> LoraLinearGroup(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                                           const std::vector<const LoraAdapter*>& ads, double scale) {
  std::vector<torch::Tensor> as, bs;
  for (const auto* ad : ads) {
    as.push_back(ad->a);
    bs.push_back(ad->b);
  }
  return LoraGroupFn::apply(x, at::TensorList(ws), at::TensorList(as), at::TensorList(bs), scale);
}

}  // namespace ftd::engine
