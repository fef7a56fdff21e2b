#include "worker/engine/model/fused_ops.h"

#if FTD_HAVE_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAFunctions.h>

#include <mutex>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/cross_entropy.h"
#include "kernels/fused_linear_ce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#endif

namespace ftd::engine::fused {

#if FTD_HAVE_KERNELS

namespace k = ftd::kernels;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

void Check(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "fused kernel ", what, " failed: ", cudaGetErrorString(e));
}

k::DType KDType(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cuda(), "fused kernels run on CUDA tensors only (", what, " is on ", t.device(), ")");
  if (t.scalar_type() == torch::kBFloat16) return k::DType::kBF16;
  if (t.scalar_type() == torch::kFloat) return k::DType::kF32;
  TORCH_CHECK(false, "fused kernels take bf16 or fp32 tensors (", what, " is ", t.scalar_type(), ")");
}

cudaStream_t Stream() { return at::cuda::getCurrentCUDAStream().stream(); }

torch::Tensor Workspace(size_t bytes, const torch::Tensor& like) {
  return torch::empty({static_cast<int64_t>(std::max<size_t>(bytes, 16))},
                      torch::TensorOptions().dtype(torch::kUInt8).device(like.device()));
}

// ---- RMSNorm -----------------------------------------------------------------------------------
// The launch plan for rows of n elements of `dt` on the current device, made on first use (PlanRmsNorm
// queries the device) and kept for the process: one per (device, dtype, n), a handful in a model.
k::RmsNormPlan RmsNormPlanFor(k::DType dt, int64_t n) {
  static std::mutex mu;
  static std::vector<k::RmsNormPlan> plans;
  const int device = c10::cuda::current_device();
  std::lock_guard<std::mutex> lock(mu);
  for (const k::RmsNormPlan& p : plans) {
    if (p.device == device && p.dtype == dt && p.n == n) return p;
  }
  k::DeviceProps props;
  Check(k::QueryDeviceProps(device, &props), "QueryDeviceProps");
  k::RmsNormPlan plan;
  Check(k::PlanRmsNorm(props, dt, n, &plan), "PlanRmsNorm");
  plans.push_back(plan);
  return plan;
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> RmsNormBackward(const torch::Tensor& dy_in, const torch::Tensor& x,
                                                        const torch::Tensor& w_in, const torch::Tensor& rstd) {
  TORCH_CHECK(x.is_contiguous() && rstd.scalar_type() == torch::kFloat && rstd.numel() == x.numel() / x.size(-1),
              "rmsnorm backward: x contiguous and rstd fp32 [rows]");
  auto w = w_in.contiguous();
  auto dy = dy_in.contiguous();
  const int64_t n = x.size(-1), rows = x.numel() / n;
  auto dx = torch::empty_like(x);
  auto dw = torch::empty_like(w);
  auto ws = Workspace(k::RmsNormBackwardWorkspaceBytes(rows, n), x);
  RECORD_FUNCTION("ftd::rmsnorm_backward", c10::ArrayRef<const c10::IValue>{});
  Check(k::RmsNormBackward(RmsNormPlanFor(KDType(x, "rmsnorm x"), n), dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                           rstd.data_ptr<float>(), dx.data_ptr(), dw.data_ptr(), ws.data_ptr(), rows, Stream()),
        "RmsNormBackward");
  return {dx, dw};
}

std::pair<torch::Tensor, torch::Tensor> SwiGluBackward(const torch::Tensor& dout_in, const torch::Tensor& gate,
                                                       const torch::Tensor& up) {
  TORCH_CHECK(gate.is_contiguous() && up.is_contiguous() && gate.sizes() == up.sizes(),
              "swiglu backward: gate and up contiguous, of one shape");
  auto dout = dout_in.contiguous();
  auto dgate = torch::empty_like(gate), dup = torch::empty_like(up);
  RECORD_FUNCTION("ftd::swiglu_backward", c10::ArrayRef<const c10::IValue>{});
  Check(k::SwiGluBackward(KDType(gate, "swiglu gate"), dout.data_ptr(), gate.data_ptr(), up.data_ptr(),
                          dgate.data_ptr(), dup.data_ptr(), gate.numel(), Stream()),
        "SwiGluBackward");
  return {dgate, dup};
}

namespace {

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& w, double eps) {
    const auto dt = KDType(x_in, "rmsnorm x");
    TORCH_CHECK(w.scalar_type() == x_in.scalar_type() && w.dim() == 1 && w.size(0) == x_in.size(-1),
                "rmsnorm: w must be [", x_in.size(-1), "] of x's dtype");
    auto x = x_in.contiguous();
    const int64_t n = x.size(-1), rows = x.numel() / n;
    auto y = torch::empty_like(x);
    auto rstd = torch::empty({rows}, x.options().dtype(torch::kFloat));
    RECORD_FUNCTION("ftd::rmsnorm_forward", c10::ArrayRef<const c10::IValue>{});
    Check(k::RmsNormForward(RmsNormPlanFor(dt, n), x.data_ptr(), w.contiguous().data_ptr(), y.data_ptr(),
                            rstd.data_ptr<float>(), rows, static_cast<float>(eps), Stream()),
          "RmsNormForward");
    ctx->save_for_backward({x, w, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [dx, dw] = RmsNormBackward(grads[0], saved[0], saved[1], saved[2]);
    return {dx, dw, torch::Tensor()};
  }
};

// ---- RoPE --------------------------------------------------------------------------------------
struct RopeFn : public torch::autograd::Function<RopeFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    const auto dt = KDType(x_in, "rope x");
    TORCH_CHECK(x_in.dim() == 4 && x_in.size(3) % 2 == 0, "rope: x must be [B, T, H, D] with D even");
    TORCH_CHECK(cos.scalar_type() == torch::kFloat && cos.is_contiguous() && sin.is_contiguous() &&
                    cos.size(0) >= x_in.size(1) && cos.size(1) == x_in.size(3) / 2,
                "rope: cos/sin must be contiguous fp32 [T, D/2]");
    auto x = x_in.contiguous();
    auto out = torch::empty_like(x);
    RECORD_FUNCTION("ftd::rope_forward", c10::ArrayRef<const c10::IValue>{});
    Check(k::RopeForward(dt, x.data_ptr(), out.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), x.size(0),
                         x.size(1), x.size(2), x.size(3), Stream()),
          "RopeForward");
    ctx->save_for_backward({cos, sin});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto dy = grads[0].contiguous();
    auto dx = torch::empty_like(dy);
    RECORD_FUNCTION("ftd::rope_backward", c10::ArrayRef<const c10::IValue>{});
    Check(k::RopeBackward(KDType(dy, "rope dy"), dy.data_ptr(), dx.data_ptr(), saved[0].data_ptr<float>(),
                          saved[1].data_ptr<float>(), dy.size(0), dy.size(1), dy.size(2), dy.size(3), Stream()),
          "RopeBackward");
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

// ---- SwiGLU ------------------------------------------------------------------------------------
struct SwiGluFn : public torch::autograd::Function<SwiGluFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate_in, const torch::Tensor& up_in) {
    const auto dt = KDType(gate_in, "swiglu gate");
    TORCH_CHECK(gate_in.sizes() == up_in.sizes() && gate_in.scalar_type() == up_in.scalar_type(),
                "swiglu: gate and up must have the same shape and dtype");
    auto gate = gate_in.contiguous(), up = up_in.contiguous();
    auto out = torch::empty_like(gate);
    RECORD_FUNCTION("ftd::swiglu_forward", c10::ArrayRef<const c10::IValue>{});
    Check(k::SwiGluForward(dt, gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(), Stream()),
          "SwiGluForward");
    ctx->save_for_backward({gate, up});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [dgate, dup] = SwiGluBackward(grads[0], saved[0], saved[1]);
    return {dgate, dup};
  }
};

struct SwiGluPackedFn : public torch::autograd::Function<SwiGluPackedFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& y_in) {
    const auto dt = KDType(y_in, "swiglu gate_up");
    TORCH_CHECK(y_in.size(-1) % 2 == 0, "swiglu: gate_up's last dimension must be even");
    auto y = y_in.contiguous();
    const int64_t f = y.size(-1) / 2, rows = y.numel() / (2 * f);
    auto shape = y.sizes().vec();
    shape.back() = f;
    auto out = torch::empty(shape, y.options());
    const size_t es = y.element_size();
    RECORD_FUNCTION("ftd::swiglu_forward", c10::ArrayRef<const c10::IValue>{});
    Check(k::SwiGluForwardRows(dt, y.data_ptr(), static_cast<char*>(y.data_ptr()) + f * es, 2 * f, out.data_ptr(), f,
                               rows, f, Stream()),
          "SwiGluForwardRows");
    ctx->save_for_backward({y});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto y = ctx->get_saved_variables()[0];
    auto dout = grads[0].contiguous();
    const int64_t f = y.size(-1) / 2, rows = y.numel() / (2 * f);
    auto dy = torch::empty_like(y);
    const size_t es = y.element_size();
    RECORD_FUNCTION("ftd::swiglu_backward", c10::ArrayRef<const c10::IValue>{});
    Check(k::SwiGluBackwardRows(KDType(y, "swiglu gate_up"), dout.data_ptr(), f, y.data_ptr(),
                                static_cast<char*>(y.data_ptr()) + f * es, 2 * f, dy.data_ptr(),
                                static_cast<char*>(dy.data_ptr()) + f * es, rows, f, Stream()),
          "SwiGluBackwardRows");
    return {dy};
  }
};

// ---- cross-entropy -----------------------------------------------------------------------------
struct CrossEntropyFn : public torch::autograd::Function<CrossEntropyFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits_in, const torch::Tensor& labels_in,
                               int64_t ignore_index) {
    const auto dt = KDType(logits_in, "cross_entropy logits");
    TORCH_CHECK(logits_in.dim() == 2 && labels_in.numel() == logits_in.size(0), "cross_entropy: logits [N, V], labels [N]");
    auto logits = logits_in.stride(1) == 1 ? logits_in : logits_in.contiguous();
    auto labels = labels_in.to(torch::kLong).contiguous();
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    auto opts = logits.options().dtype(torch::kFloat);
    auto loss = torch::empty({rows}, opts), lse = torch::empty({rows}, opts);
    RECORD_FUNCTION("ftd::cross_entropy_forward", c10::ArrayRef<const c10::IValue>{});
    Check(k::CrossEntropyForward(dt, logits.data_ptr(), logits.stride(0), labels.data_ptr<int64_t>(),
                                 loss.data_ptr<float>(), lse.data_ptr<float>(), rows, vocab, ignore_index, Stream()),
          "CrossEntropyForward");
    ctx->save_for_backward({logits, labels, lse});
    ctx->saved_data["ignore_index"] = ignore_index;
    return loss.sum();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const auto& labels = saved[1];
    const auto& lse = saved[2];
    auto g = grads[0].to(torch::kFloat).contiguous();  // 0-dim: the same weight for every row
    auto dlogits = torch::empty({logits.size(0), logits.size(1)}, logits.options());
    RECORD_FUNCTION("ftd::cross_entropy_backward", c10::ArrayRef<const c10::IValue>{});
    Check(k::CrossEntropyBackward(KDType(logits, "cross_entropy logits"), logits.data_ptr(), logits.stride(0),
                                  labels.data_ptr<int64_t>(), lse.data_ptr<float>(), g.data_ptr<float>(), 0,
                                  dlogits.data_ptr(), dlogits.stride(0), logits.size(0), logits.size(1),
                                  ctx->saved_data["ignore_index"].toInt(), Stream()),
          "CrossEntropyBackward");
    return {dlogits, torch::Tensor(), torch::Tensor()};
  }
};

// ---- fused linear cross-entropy -----------------------------------------------------------------
// Rows per chunk: the chunk's logits [chunk, V] are the only vocabulary-sized buffer (2048 x 128256
// bf16 = 0.5 GB for LLaMA-3's vocabulary); spec.kernel_tuning.linear_cross_entropy_chunk_rows.
int64_t ChunkRows(int64_t rows, int64_t chunk) { return std::max<int64_t>(1, std::min(rows, chunk)); }

struct LinearCrossEntropyFn : public torch::autograd::Function<LinearCrossEntropyFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& w_in,
                               const torch::Tensor& labels_in, const torch::Tensor& scale_in, int64_t ignore_index,
                               int64_t chunk_rows) {
    const auto dt = KDType(x_in, "linear_cross_entropy x");
    TORCH_CHECK(x_in.dim() == 2 && w_in.dim() == 2 && x_in.size(1) == w_in.size(1) &&
                    x_in.scalar_type() == w_in.scalar_type() && labels_in.numel() == x_in.size(0),
                "linear_cross_entropy: x [N, H], w [V, H] of one dtype, labels [N]");
    auto x = x_in.contiguous(), w = w_in.contiguous();
    auto labels = labels_in.to(torch::kLong).contiguous();
    const int64_t rows = x.size(0), hidden = x.size(1), vocab = w.size(0), chunk = ChunkRows(rows, chunk_rows);
    auto opts = x.options().dtype(torch::kFloat);
    auto loss = torch::empty({rows}, opts), lse = torch::empty({rows}, opts);
    // A frozen weight (LoRA's lm_head) gets no gradient: the kernel skips its GEMM.
    const bool weight_grad = w_in.requires_grad();
    auto dx = torch::empty_like(x);
    auto dw = weight_grad ? torch::empty_like(w) : torch::Tensor();
    auto scale = scale_in.to(x.device(), torch::kFloat).reshape({});
    const size_t ws_bytes = k::FusedLinearCrossEntropyWorkspaceBytes(dt, rows, hidden, vocab, chunk);
    auto ws = Workspace(ws_bytes, x);
    RECORD_FUNCTION("ftd::linear_cross_entropy_forward", c10::ArrayRef<const c10::IValue>{});
    Check(k::FusedLinearCrossEntropy(at::cuda::getCurrentCUDABlasHandle(), dt, x.data_ptr(), w.data_ptr(),
                                     labels.data_ptr<int64_t>(), loss.data_ptr<float>(), lse.data_ptr<float>(),
                                     dx.data_ptr(), weight_grad ? dw.data_ptr() : nullptr, /*accumulate_dweight=*/false,
                                     scale.data_ptr<float>(), ws.data_ptr(), ws_bytes, rows, hidden, vocab, chunk,
                                     ignore_index, Stream()),
          "FusedLinearCrossEntropy");
    // The gradients of scale * sum(loss) are computed here; backward only multiplies them by the
    // incoming gradient (exactly 1 when this is the loss that backward starts from).
    ctx->save_for_backward({dx, dw});
    ctx->saved_data["weight_grad"] = weight_grad;
    return loss.sum() * scale;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    RECORD_FUNCTION("ftd::linear_cross_entropy_backward", c10::ArrayRef<const c10::IValue>{});
    auto g = grads[0];  // 0-dim
    auto dx = saved[0].mul_(g.to(saved[0].scalar_type()));
    torch::Tensor dw;
    if (ctx->saved_data["weight_grad"].toBool()) dw = saved[1].mul_(g.to(saved[1].scalar_type()));
    return {dx, dw, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool Available() { return true; }

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) { return RmsNormFn::apply(x, w, eps); }
torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return RopeFn::apply(x, cos, sin);
}
torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up) { return SwiGluFn::apply(gate, up); }
torch::Tensor SwiGluPacked(const torch::Tensor& gate_up) { return SwiGluPackedFn::apply(gate_up); }
torch::Tensor CrossEntropySum(const torch::Tensor& logits, const torch::Tensor& labels, int64_t ignore_index) {
  return CrossEntropyFn::apply(logits, labels, ignore_index);
}
torch::Tensor LinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& labels,
                                 const torch::Tensor& scale, int64_t ignore_index, int64_t chunk_rows) {
  return LinearCrossEntropyFn::apply(x, w, labels, scale, ignore_index, chunk_rows);
}

torch::Tensor GradNorm(const std::vector<torch::Tensor>& grads) {
  TORCH_CHECK(!grads.empty(), "grad norm of no tensors");
  std::vector<const void*> ptrs;
  std::vector<int64_t> numels;
  for (const auto& g : grads) {
    TORCH_CHECK(g.is_contiguous() && g.scalar_type() == grads[0].scalar_type(), "grad norm: contiguous, one dtype");
    ptrs.push_back(g.data_ptr());
    numels.push_back(g.numel());
  }
  const int n = static_cast<int>(grads.size());
  const size_t ws_bytes = k::MultiTensorSumSquaresWorkspaceBytes(numels.data(), n);
  auto ws = Workspace(ws_bytes, grads[0]);
  auto out = torch::empty({}, grads[0].options().dtype(torch::kFloat));
  RECORD_FUNCTION("ftd::adamw_grad_norm", c10::ArrayRef<const c10::IValue>{});
  Check(k::MultiTensorSumSquares(ptrs.data(), numels.data(), n, KDType(grads[0], "grad"), out.data_ptr<float>(),
                                 ws.data_ptr(), ws_bytes, Stream()),
        "MultiTensorSumSquares");
  return out.sqrt();
}

void AdamWStep(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& masters,
               const std::vector<torch::Tensor>& grads, const std::vector<torch::Tensor>& exp_avgs,
               const std::vector<torch::Tensor>& exp_avg_sqs, const std::vector<double>& weight_decays,
               const AdamWHyper& h, const torch::Tensor& step, const torch::Tensor& grad_scale,
               const torch::Tensor& found_inf) {
  if (params.empty()) return;
  std::vector<k::AdamWTensor> ts(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TORCH_CHECK(params[i].is_contiguous() && grads[i].is_contiguous() && exp_avgs[i].is_contiguous() &&
                    exp_avg_sqs[i].is_contiguous(),
                "adamw: tensors must be contiguous");
    ts[i].param = params[i].data_ptr();
    ts[i].master = masters.empty() ? nullptr : masters[i].data_ptr<float>();
    ts[i].grad = grads[i].data_ptr();
    ts[i].exp_avg = exp_avgs[i].data_ptr();
    ts[i].exp_avg_sq = exp_avg_sqs[i].data_ptr();
    ts[i].numel = params[i].numel();
    ts[i].weight_decay = static_cast<float>(weight_decays[i]);
  }
  k::AdamWParams p{};
  p.lr = static_cast<float>(h.lr);
  p.beta1 = static_cast<float>(h.beta1);
  p.beta2 = static_cast<float>(h.beta2);
  p.eps = static_cast<float>(h.eps);
  p.param_dtype = KDType(params[0], "adamw param");
  p.grad_dtype = KDType(grads[0], "adamw grad");
  p.moment_dtype = KDType(exp_avgs[0], "adamw exp_avg");
  RECORD_FUNCTION("ftd::adamw_step", c10::ArrayRef<const c10::IValue>{});
  Check(k::AdamWStep(ts.data(), static_cast<int>(ts.size()), p, step.data_ptr<float>(),
                     grad_scale.defined() ? grad_scale.data_ptr<float>() : nullptr,
                     found_inf.defined() ? found_inf.data_ptr<float>() : nullptr, Stream()),
        "AdamWStep");
}

#else  // built without nvcc: the fused set is refused before any of these is reached

namespace {
[[noreturn]] void Missing() {
  TORCH_CHECK(false, "this ftd-worker was built without the fused CUDA kernels (no nvcc at build time); use kernel_set "
                     "\"eager\"");
}
}  // namespace

bool Available() { return false; }
torch::Tensor RmsNorm(const torch::Tensor&, const torch::Tensor&, double) { Missing(); }
std::pair<torch::Tensor, torch::Tensor> RmsNormBackward(const torch::Tensor&, const torch::Tensor&,
                                                        const torch::Tensor&, const torch::Tensor&) {
  Missing();
}
std::pair<torch::Tensor, torch::Tensor> SwiGluBackward(const torch::Tensor&, const torch::Tensor&,
                                                       const torch::Tensor&) {
  Missing();
}
torch::Tensor Rope(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) { Missing(); }
torch::Tensor SwiGlu(const torch::Tensor&, const torch::Tensor&) { Missing(); }
torch::Tensor SwiGluPacked(const torch::Tensor&) { Missing(); }
torch::Tensor CrossEntropySum(const torch::Tensor&, const torch::Tensor&, int64_t) { Missing(); }
torch::Tensor LinearCrossEntropy(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                 int64_t, int64_t) {
  Missing();
}
torch::Tensor GradNorm(const std::vector<torch::Tensor>&) { Missing(); }
void AdamWStep(const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
               const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&, const std::vector<double>&,
               const AdamWHyper&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  Missing();
}

#endif

}  // namespace ftd::engine::fused
