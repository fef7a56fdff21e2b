#include "worker/engine/fp8_ops.h"

#include "absl/strings/str_cat.h"

#if FTD_HAVE_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAFunctions.h>

#include <functional>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/fp8_cast.h"
#include "kernels/launch_plan.h"
#include "worker/engine/fused_ops.h"
#endif

namespace ftd::engine::fp8 {

absl::Status CheckShapes(const LlamaConfig& c) {
  const std::pair<const char*, int64_t> widths[] = {
      {"hidden_size", c.hidden_size},
      {"num_attention_heads * head_dim", c.num_attention_heads * c.head_dim},
      {"num_key_value_heads * head_dim", c.num_key_value_heads * c.head_dim},
      {"intermediate_size", c.intermediate_size}};
  for (const auto& [name, w] : widths) {
    if (w % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FP8 matmuls need every projection width to be a multiple of 16 (cuBLASLt), but the model's ", name, " is ",
          w, ": use kernel_set \"fused\" for this model"));
    }
  }
  return absl::OkStatus();
}

#if FTD_HAVE_KERNELS

namespace k = ftd::kernels;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr int64_t kAlign = 16;  // cuBLASLt's FP8 GEMMs: every dimension a multiple of 16

k::DeviceProps PropsFor(int device) {
  static std::mutex mu;
  static std::vector<k::DeviceProps> props;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& p : props) {
    if (p.device == device) return p;
  }
  k::DeviceProps p;
  const cudaError_t e = k::QueryDeviceProps(device, &p);
  TORCH_CHECK(e == cudaSuccess, "QueryDeviceProps: ", cudaGetErrorString(e));
  props.push_back(p);
  return p;
}

k::Fp8Format FormatOf(torch::ScalarType t) {
  TORCH_CHECK(t == torch::kFloat8_e4m3fn || t == torch::kFloat8_e5m2, "fp8: the target must be float8_e4m3fn or "
                                                                       "float8_e5m2 (got ", t, ")");
  return t == torch::kFloat8_e4m3fn ? k::Fp8Format::kE4M3 : k::Fp8Format::kE5M2;
}

k::DType KDTypeOf(const torch::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat,
              "fp8: the source must be bf16 or fp32 (got ", x.scalar_type(), ")");
  return x.scalar_type() == torch::kFloat ? k::DType::kF32 : k::DType::kBF16;
}

// x (contiguous) cast into `data` (x's shape, an FP8 dtype) with stats = [amax, scale_inv] (fp32 [2]).
void QuantizeInto(const torch::Tensor& x, const torch::Tensor& data, const torch::Tensor& stats) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "fp8: the source must be a contiguous CUDA tensor");
  const k::DType dt = KDTypeOf(x);
  auto* s = stats.data_ptr<float>();
  RECORD_FUNCTION("ftd::fp8_cast", c10::ArrayRef<const c10::IValue>{});
  const cudaError_t e = k::Fp8CastAmax(PropsFor(x.get_device()), dt, FormatOf(data.scalar_type()), x.data_ptr(),
                                       x.numel(), static_cast<uint8_t*>(data.data_ptr()), s, s + 1,
                                       at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(e == cudaSuccess, "Fp8CastAmax failed: ", cudaGetErrorString(e));
}

Fp8Tensor Make(const torch::Tensor& like, torch::ScalarType dtype, torch::Tensor* stats) {
  *stats = torch::empty({2}, like.options().dtype(torch::kFloat));
  return {torch::empty(like.sizes(), like.options().dtype(dtype)), stats->select(0, 1)};
}

// The transpose of a 2-D FP8 tensor, contiguous (a byte copy; the scale is unchanged).
Fp8Tensor Transposed(const Fp8Tensor& t) {
  const auto dtype = t.data.scalar_type();
  return {t.data.view(torch::kUInt8).t().contiguous().view(dtype), t.scale_inv};
}

int64_t RoundUp(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Rows [0, m) of `t` followed by zero rows up to `rows` (a view when rows == m).
torch::Tensor PadRows(const torch::Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t;
  return torch::constant_pad_nd(t, {0, 0, 0, rows - t.size(0)});
}

// The GEMMs of the projections of one input, given its E4M3 copy x8 [mp, in] (rows padded to a multiple
// of 16 with zero rows, which change neither the amax nor any sum over rows in backward): y_i = x W_i^T,
// the first m rows, in x's shape with the last dimension N_i. `saved` gets x8 and every weight's E4M3 copy.
variable_list ForwardGemms(const Fp8Tensor& x8, at::TensorList ws, WeightCache* cache, std::vector<int64_t> shape,
                           torch::ScalarType dtype, variable_list* saved) {
  const int64_t m = c10::multiply_integers(shape.begin(), shape.end() - 1);
  saved->insert(saved->end(), {x8.data, x8.scale_inv});
  variable_list out;
  for (const auto& w : ws) {
    const Fp8Tensor& w8 = cache->Get(w);
    auto y = MatmulNT(x8, w8, dtype);
    shape.back() = w.size(0);
    out.push_back(y.narrow(0, 0, m).view(shape));
    saved->insert(saved->end(), {w8.data, w8.scale_inv});
  }
  return out;
}

// The backward of ForwardGemms from saved[first..] (x8, then the weights' copies): dW_i into
// (*out)[dw_slot + i] where wanted, and returns dx [m, in] in `dtype` (the sum over i of dy_i W_i,
// accumulated in fp32 when there are several projections; undefined unless want_dx).
torch::Tensor BackwardGemms(AutogradContext* ctx, const variable_list& saved, size_t first, const variable_list& grads,
                            int64_t m, torch::ScalarType dtype, bool want_dx, size_t dw_slot, variable_list* out) {
  const int64_t n = static_cast<int64_t>(grads.size());
  const Fp8Tensor x8{saved[first], saved[first + 1]};
  const int64_t mp = x8.data.size(0), in = x8.data.size(1);
  const auto dx_dtype = n > 1 ? torch::kFloat : dtype;
  torch::Tensor dx;
  Fp8Tensor x8t;  // [in, mp]: the second operand of every dW
  for (int64_t i = 0; i < n; ++i) {
    if (!grads[i].defined()) continue;  // an unused projection contributes nothing
    const Fp8Tensor w8{saved[first + 2 + 2 * i], saved[first + 3 + 2 * i]};
    const Fp8Tensor g8 = Quantize(PadRows(grads[i].reshape({m, -1}), mp), torch::kFloat8_e5m2);  // [mp, N]
    if (want_dx) {
      auto part = MatmulNT(g8, Transposed(w8), dx_dtype);  // [mp, N] x [N, in]
      dx = dx.defined() ? dx.add_(part) : part;
    }
    if (ctx->needs_input_grad(dw_slot + i)) {
      if (!x8t.data.defined()) x8t = Transposed(x8);
      (*out)[dw_slot + i] = MatmulNT(Transposed(g8), x8t, dtype);  // [N, mp] x [mp, in]
    }
  }
  if (!want_dx) return {};
  if (!dx.defined()) return torch::zeros({m, in}, x8.data.options().dtype(dtype));
  return dx.narrow(0, 0, m).to(dtype);
}

// An FP8 tensor of `rows` x `cols` with rows padded to a multiple of 16 (zero bytes, FP8 zero), and its
// [amax, scale_inv] buffer.
Fp8Tensor MakePadded(int64_t rows, int64_t cols, const torch::Tensor& like, torch::Tensor* stats) {
  const int64_t rp = RoundUp(rows);
  *stats = torch::empty({2}, like.options().dtype(torch::kFloat));
  auto data = torch::empty({rp, cols}, like.options().dtype(torch::kFloat8_e4m3fn));
  if (rp > rows) data.narrow(0, rows, rp - rows).view(torch::kUInt8).zero_();
  return {data, stats->select(0, 1)};
}

// The forward of a producer with the cast fused: `cast` writes the E4M3 copy of the producer's output
// (shaped as `like`, [..., in]) into out with [amax, scale_inv] at stats; then the projections. Saves
// `saved` (what the producer's backward needs), then the GEMMs' operands, and the row count.
variable_list FusedCastForward(AutogradContext* ctx, const torch::Tensor& like, at::TensorList ws, int64_t cache_addr,
                               variable_list saved, const char* what,
                               const std::function<cudaError_t(uint8_t* out, float* stats, cudaStream_t)>& cast) {
  const int64_t in = like.size(-1), m = like.numel() / in;
  torch::Tensor stats;
  const Fp8Tensor y8 = MakePadded(m, in, like, &stats);
  RECORD_FUNCTION(what, c10::ArrayRef<const c10::IValue>{});
  const cudaError_t e = cast(static_cast<uint8_t*>(y8.data.data_ptr()), stats.data_ptr<float>(),
                             at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(e == cudaSuccess, what, " failed: ", cudaGetErrorString(e));
  auto out = ForwardGemms(y8, ws, reinterpret_cast<WeightCache*>(cache_addr), like.sizes().vec(), like.scalar_type(),
                          &saved);
  ctx->save_for_backward(saved);
  ctx->saved_data["m"] = m;
  return out;
}

// The backward of FusedCastForward: the GEMMs' (dW into slots 2.., after the producer's two inputs), then
// `producer_backward(dy of its output, saved)` gives the gradients of the producer's two inputs. The
// function's inputs: the producer's two, n weights, then `trailing` non-tensor ones.
variable_list FusedCastBackward(
    AutogradContext* ctx, const variable_list& grads, size_t first, size_t trailing,
    const std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor&, const variable_list&)>&
        producer_backward) {
  const auto saved = ctx->get_saved_variables();
  const auto& in = saved[0];
  variable_list out(grads.size() + 2 + trailing);
  const bool want = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
  auto dy = BackwardGemms(ctx, saved, first, grads, ctx->saved_data["m"].toInt(), in.scalar_type(), want, 2, &out);
  if (want) std::tie(out[0], out[1]) = producer_backward(dy.view(in.sizes()), saved);
  return out;
}

// Inputs (flattened by LibTorch): x, then n weights, then the cache's address; outputs: n projections.
struct LinearsFn : public torch::autograd::Function<LinearsFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList ws, int64_t cache_addr) {
    const int64_t in = x.size(-1), m = x.numel() / in;
    const Fp8Tensor x8 = Quantize(PadRows(x.reshape({m, in}), RoundUp(m)), torch::kFloat8_e4m3fn);
    variable_list saved;
    auto out = ForwardGemms(x8, ws, reinterpret_cast<WeightCache*>(cache_addr), x.sizes().vec(), x.scalar_type(),
                            &saved);
    ctx->save_for_backward(saved);
    ctx->saved_data["m"] = m;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["dtype"] = x.scalar_type();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t m = ctx->saved_data["m"].toInt();
    variable_list out(grads.size() + 2);
    auto dx = BackwardGemms(ctx, ctx->get_saved_variables(), 0, grads, m, ctx->saved_data["dtype"].toScalarType(),
                            ctx->needs_input_grad(0), 1, &out);
    if (dx.defined()) out[0] = dx.view(ctx->saved_data["x_shape"].toIntVector());
    return out;  // the last entry, for the cache's address, stays undefined
  }
};

// RMSNorm, its output cast to E4M3 in the same kernel (kernels::RmsNormFp8), then the projections.
// Inputs: x, the norm's weight, n weights, eps, the cache's address. Saves x, the norm's weight and rstd
// (the norm's backward) and the E4M3 output; the bf16 norm output is never made.
struct NormLinearsFn : public torch::autograd::Function<NormLinearsFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& nw,
                               at::TensorList ws, double eps, int64_t cache_addr) {
    TORCH_CHECK(x_in.is_cuda() && nw.scalar_type() == x_in.scalar_type() && nw.dim() == 1 &&
                    nw.size(0) == x_in.size(-1),
                "fp8 norm: x on CUDA and the norm's weight [", x_in.size(-1), "] of x's dtype");
    auto x = x_in.contiguous();
    auto w = nw.contiguous();
    const int64_t m = x.numel() / x.size(-1);
    auto rstd = torch::empty({m}, x.options().dtype(torch::kFloat));
    return FusedCastForward(ctx, x, ws, cache_addr, {x, w, rstd}, "ftd::rmsnorm_fp8",
                            [&](uint8_t* out, float* stats, cudaStream_t stream) {
                              return k::RmsNormFp8(PropsFor(x.get_device()), KDTypeOf(x), k::Fp8Format::kE4M3,
                                                   x.data_ptr(), w.data_ptr(), m, x.size(-1), static_cast<float>(eps),
                                                   rstd.data_ptr<float>(), out, stats, stats + 1, stream);
                            });
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // saved: x, the norm's weight, rstd, then the GEMMs' operands; trailing inputs: eps, the cache.
    return FusedCastBackward(ctx, grads, 3, 2, [](const torch::Tensor& dh, const variable_list& saved) {
      return fused::RmsNormBackward(dh, saved[0], saved[1], saved[2]);
    });
  }
};

// SwiGLU, its output cast to E4M3 in the same kernel (kernels::SwiGluFp8), then the projection(s).
// Inputs: gate, up, n weights, the cache's address. Saves gate and up (SwiGLU's backward) and the E4M3
// output; the bf16 product is never made.
struct SwiGluLinearsFn : public torch::autograd::Function<SwiGluLinearsFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& gate_in, const torch::Tensor& up_in,
                               at::TensorList ws, int64_t cache_addr) {
    TORCH_CHECK(gate_in.is_cuda() && gate_in.sizes() == up_in.sizes() && gate_in.scalar_type() == up_in.scalar_type(),
                "fp8 swiglu: gate and up on CUDA, of one shape and dtype");
    auto gate = gate_in.contiguous(), up = up_in.contiguous();
    return FusedCastForward(ctx, gate, ws, cache_addr, {gate, up}, "ftd::swiglu_fp8",
                            [&](uint8_t* out, float* stats, cudaStream_t stream) {
                              return k::SwiGluFp8(PropsFor(gate.get_device()), KDTypeOf(gate), k::Fp8Format::kE4M3,
                                                  gate.data_ptr(), up.data_ptr(), gate.numel(), out, stats, stats + 1,
                                                  stream);
                            });
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // saved: gate, up, then the GEMMs' operands; trailing input: the cache.
    return FusedCastBackward(ctx, grads, 2, 1, [](const torch::Tensor& ds, const variable_list& saved) {
      return fused::SwiGluBackward(ds, saved[0], saved[1]);
    });
  }
};

}  // namespace

Fp8Tensor Quantize(const torch::Tensor& x_in, torch::ScalarType dtype) {
  auto x = x_in.contiguous();
  torch::Tensor stats;
  Fp8Tensor t = Make(x, dtype, &stats);
  QuantizeInto(x, t.data, stats);
  return t;
}

torch::Tensor MatmulNT(const Fp8Tensor& a, const Fp8Tensor& b, torch::ScalarType out_dtype) {
  TORCH_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(1),
              "fp8 matmul: a [M, K] and b [N, K] (got ", a.data.sizes(), " and ", b.data.sizes(), ")");
  TORCH_CHECK(a.data.size(1) % kAlign == 0 && b.data.size(0) % kAlign == 0,
              "fp8 matmul: K and N must be multiples of 16 (got K ", a.data.size(1), ", N ", b.data.size(0), ")");
  TORCH_CHECK(!(a.data.scalar_type() == torch::kFloat8_e5m2 && b.data.scalar_type() == torch::kFloat8_e5m2),
              "fp8 matmul: E5M2 x E5M2 is not supported by cuBLASLt");
  // b.t() is b^T in column-major order, the layout cuBLASLt's FP8 GEMM takes for its second operand.
  // cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED) a scale pointer that is not 16-byte aligned, and
  // scale_inv views the second element of its stats buffer: hand it a copy of its own.
  auto aligned = [](const torch::Tensor& s) { return s.storage_offset() == 0 ? s : s.clone(); };
  return at::_scaled_mm(a.data.contiguous(), b.data.contiguous().t(), aligned(a.scale_inv), aligned(b.scale_inv),
                        std::nullopt, std::nullopt, out_dtype, /*use_fast_accum=*/false);
}

const Fp8Tensor& WeightCache::Get(const torch::Tensor& w) {
  Entry& e = entries_[w.unsafeGetTensorImpl()];
  if (e.generation != generation_) {
    torch::NoGradGuard no_grad;
    if (!e.fp8.data.defined()) e.fp8 = Make(w, torch::kFloat8_e4m3fn, &e.stats);
    QuantizeInto(w.contiguous(), e.fp8.data, e.stats);
    e.generation = generation_;
  }
  return e.fp8;
}

std::vector<torch::Tensor> Linears(const torch::Tensor& x, const std::vector<torch::Tensor>& ws, WeightCache* cache) {
  return LinearsFn::apply(x, at::TensorList(ws), static_cast<int64_t>(reinterpret_cast<intptr_t>(cache)));
}

std::vector<torch::Tensor> NormLinears(const torch::Tensor& x, const torch::Tensor& norm_w, double eps,
                                       const std::vector<torch::Tensor>& ws, WeightCache* cache) {
  return NormLinearsFn::apply(x, norm_w, at::TensorList(ws), eps,
                              static_cast<int64_t>(reinterpret_cast<intptr_t>(cache)));
}

std::vector<torch::Tensor> SwiGluLinears(const torch::Tensor& gate, const torch::Tensor& up,
                                         const std::vector<torch::Tensor>& ws, WeightCache* cache) {
  return SwiGluLinearsFn::apply(gate, up, at::TensorList(ws), static_cast<int64_t>(reinterpret_cast<intptr_t>(cache)));
}

#else  // built without nvcc: the fp8 set is refused before any of these is reached

namespace {
[[noreturn]] void Missing() {
  TORCH_CHECK(false, "this ftd-worker was built without ftd's CUDA kernels (no nvcc at build time); use kernel_set "
                     "\"eager\"");
}
}  // namespace

Fp8Tensor Quantize(const torch::Tensor&, torch::ScalarType) { Missing(); }
torch::Tensor MatmulNT(const Fp8Tensor&, const Fp8Tensor&, torch::ScalarType) { Missing(); }
const Fp8Tensor& WeightCache::Get(const torch::Tensor&) { Missing(); }
std::vector<torch::Tensor> Linears(const torch::Tensor&, const std::vector<torch::Tensor>&, WeightCache*) { Missing(); }
std::vector<torch::Tensor> NormLinears(const torch::Tensor&, const torch::Tensor&, double,
                                       const std::vector<torch::Tensor>&, WeightCache*) {
  Missing();
}
std::vector<torch::Tensor> SwiGluLinears(const torch::Tensor&, const torch::Tensor&, const std::vector<torch::Tensor>&,
                                         WeightCache*) {
  Missing();
}

#endif

}  // namespace ftd::engine::fp8
