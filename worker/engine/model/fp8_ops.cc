#include "worker/engine/model/fp8_ops.h"

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
#include "kernels/fp8_tiles.h"
#include "kernels/launch_plan.h"
#include "worker/engine/model/fused_ops.h"
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

// A tensor's [amax, scale_inv] buffer: amax at element 0, scale_inv at element kScaleInvAt, 16 bytes
// in, so that the scale handed to cuBLASLt is 16-byte aligned (it refuses others).
constexpr int64_t kScaleInvAt = 4;
torch::Tensor NewStats(const torch::Tensor& like) { return torch::empty({8}, like.options().dtype(torch::kFloat)); }
float* AmaxPtr(const torch::Tensor& stats) { return stats.data_ptr<float>(); }
float* ScaleInvPtr(const torch::Tensor& stats) { return stats.data_ptr<float>() + kScaleInvAt; }

// x (contiguous) cast into `data` (x's shape, an FP8 dtype), its amax and scale_inv into stats (NewStats).
void QuantizeInto(const torch::Tensor& x, const torch::Tensor& data, const torch::Tensor& stats) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "fp8: the source must be a contiguous CUDA tensor");
  const k::DType dt = KDTypeOf(x);
  RECORD_FUNCTION("ftd::fp8_cast", c10::ArrayRef<const c10::IValue>{});
  const cudaError_t e = k::Fp8CastAmax(PropsFor(x.get_device()), dt, FormatOf(data.scalar_type()), x.data_ptr(),
                                       x.numel(), static_cast<uint8_t*>(data.data_ptr()), AmaxPtr(stats),
                                       ScaleInvPtr(stats), at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(e == cudaSuccess, "Fp8CastAmax failed: ", cudaGetErrorString(e));
}

Fp8Tensor Make(const torch::Tensor& like, torch::ScalarType dtype, torch::Tensor* stats) {
  *stats = NewStats(like);
  return {torch::empty(like.sizes(), like.options().dtype(dtype)), stats->select(0, kScaleInvAt)};
}

k::Fp8Source SourceOf(const torch::Tensor& t, const float* amax = nullptr) {
  if (!t.defined()) return {};
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, "fp8: a tile cast's source must be 2-D with unit column stride");
  return {t.data_ptr(), t.size(0), t.size(1), t.stride(0), amax};
}

// The transpose of a 2-D FP8 tensor, contiguous (kernels::Fp8Transpose: the bytes in 64 x 64 tiles; the
// scale is unchanged).
Fp8Tensor Transposed(const Fp8Tensor& t) {
  TORCH_CHECK(t.data.dim() == 2 && t.data.is_contiguous(), "fp8: Transposed takes a contiguous 2-D tensor");
  auto out = torch::empty({t.data.size(1), t.data.size(0)}, t.data.options());
  RECORD_FUNCTION("ftd::fp8_transpose", c10::ArrayRef<const c10::IValue>{});
  const cudaError_t e = k::Fp8Transpose(PropsFor(t.data.get_device()), static_cast<const uint8_t*>(t.data.data_ptr()),
                                        t.data.size(0), t.data.size(1), static_cast<uint8_t*>(out.data_ptr()),
                                        at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(e == cudaSuccess, "Fp8Transpose failed: ", cudaGetErrorString(e));
  return {out, t.scale_inv};
}

// kernels::Fp8CastTiles on the current stream, with its stats buffer; what is not wanted is undefined.
struct TileCastOut {
  Fp8Tensor rows, cols;  // S [R, C] and S^T [C, R]
};
TileCastOut CastTiles(k::Fp8Concat concat, const std::vector<k::Fp8Source>& sources, torch::ScalarType src_dtype,
                      int64_t rows_out, torch::ScalarType dtype, bool want_rows, bool want_cols,
                      k::Fp8ScaleFrom from, const torch::Tensor& like) {
  TORCH_CHECK(!sources.empty() && sources.size() <= static_cast<size_t>(k::kFp8MaxSources),
              "fp8: a tile cast takes 1 to ", k::kFp8MaxSources, " sources");
  k::Fp8TileCast p;
  p.dtype = src_dtype == torch::kFloat ? k::DType::kF32 : k::DType::kBF16;
  p.format = FormatOf(dtype);
  p.concat = concat;
  p.scale_from = from;
  p.num_sources = static_cast<int>(sources.size());
  int64_t r0 = 0, c0 = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    p.sources[i] = sources[i];
    r0 = concat == k::Fp8Concat::kCols ? sources[i].rows : r0 + sources[i].rows;
    c0 = concat == k::Fp8Concat::kCols ? c0 + sources[i].cols : sources[i].cols;
  }
  p.rows_out = std::max(rows_out, r0);
  torch::Tensor stats = NewStats(like);
  TileCastOut out;
  const auto opts = like.options().dtype(dtype);
  if (want_rows) out.rows = {torch::empty({p.rows_out, c0}, opts), stats.select(0, kScaleInvAt)};
  if (want_cols) out.cols = {torch::empty({c0, p.rows_out}, opts), stats.select(0, kScaleInvAt)};
  p.out = want_rows ? static_cast<uint8_t*>(out.rows.data.data_ptr()) : nullptr;
  p.out_t = want_cols ? static_cast<uint8_t*>(out.cols.data.data_ptr()) : nullptr;
  p.amax = AmaxPtr(stats);
  p.scale_inv = ScaleInvPtr(stats);
  RECORD_FUNCTION("ftd::fp8_cast_tiles", c10::ArrayRef<const c10::IValue>{});
  const cudaError_t e = k::Fp8CastTiles(PropsFor(like.get_device()), p, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(e == cudaSuccess, "Fp8CastTiles failed: ", cudaGetErrorString(e));
  return out;
}

int64_t RoundUp(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Rows [0, m) of `t` followed by zero rows up to `rows` (a view when rows == m).
torch::Tensor PadRows(const torch::Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t;
  return torch::constant_pad_nd(t, {0, 0, 0, rows - t.size(0)});
}

// The GEMMs of the projections of one input, given its E4M3 copy x8 [mp, in] (rows padded to a multiple
// of 16 with zero rows, which change neither the amax nor any sum over rows in backward): y_i = x W_i^T,
// the first m rows, in x's shape with the last dimension N_i. `saved` gets x8, then each weight and its
// amax (the cache's stats: the backward casts the weights again with the same amax, straight into the
// transposed layout, rather than keeping their E4M3 copies from forward to backward).
variable_list ForwardGemms(const Fp8Tensor& x8, at::TensorList ws, WeightCache* cache, std::vector<int64_t> shape,
                           torch::ScalarType dtype, variable_list* saved) {
  TORCH_CHECK(!ws.empty() && ws.size() <= static_cast<size_t>(k::kFp8MaxSources), "fp8: 1 to ",
              k::kFp8MaxSources, " projections of one input");
  const int64_t m = c10::multiply_integers(shape.begin(), shape.end() - 1);
  saved->insert(saved->end(), {x8.data, x8.scale_inv});
  variable_list out;
  for (const auto& w : ws) {
    const Fp8Tensor w8 = cache->Cast(w);
    auto y = MatmulNT(x8, w8, dtype, cache->fast_accum_forward());
    shape.back() = w.size(0);
    out.push_back(y.narrow(0, 0, m).view(shape));
    saved->insert(saved->end(), {w, cache->Stats(w)});
  }
  return out;
}

// The backward of ForwardGemms from saved[first..] (x8, then each weight and its stats), one projection
// group at once:
//   G = [dy_0 | dy_1 | ...] in E5M2 with one scale, [mp, sum N] and its transpose (one tile cast);
//   dx = G [W_0; W_1; ...] with the stacked weights cast in E4M3 (their largest amax) straight into the
//     transposed layout cuBLASLt takes: one GEMM, bf16 out, no partial sums;
//   [dW_0; dW_1; ...] = G^T x8: one GEMM, each dW_i a block of its rows.
// dW_i into (*out)[dw_slot + i] where wanted; returns dx [m, in] in `dtype` (undefined unless want_dx).
torch::Tensor BackwardGemms(AutogradContext* ctx, const variable_list& saved, size_t first, const variable_list& grads,
                            int64_t m, torch::ScalarType dtype, bool want_dx, size_t dw_slot, variable_list* out) {
  const int64_t n = static_cast<int64_t>(grads.size());
  const Fp8Tensor x8{saved[first], saved[first + 1]};
  const int64_t mp = x8.data.size(0), in = x8.data.size(1);
  std::vector<k::Fp8Source> gs, ws;
  std::vector<torch::Tensor> keep;  // the contiguous gradients the casts read
  std::vector<int64_t> widths;
  bool any_grad = false, want_dw = false;
  for (int64_t i = 0; i < n; ++i) {
    const auto& w = saved[first + 2 + 2 * i];
    const auto& stats = saved[first + 3 + 2 * i];
    widths.push_back(w.size(0));
    ws.push_back(SourceOf(w, AmaxPtr(stats)));
    want_dw = want_dw || ctx->needs_input_grad(dw_slot + i);
    if (!grads[i].defined()) {  // an unused projection contributes nothing: a source of zeros
      gs.push_back({nullptr, m, w.size(0), w.size(0), nullptr});
      continue;
    }
    any_grad = true;
    auto g = grads[i].reshape({m, w.size(0)});
    if (g.stride(1) != 1 || g.stride(0) < g.size(1)) g = g.contiguous();
    keep.push_back(g);
    gs.push_back(SourceOf(g));
  }
  if (!any_grad) return want_dx ? torch::zeros({m, in}, x8.data.options().dtype(dtype)) : torch::Tensor();
  const auto gdtype = keep.front().scalar_type();
  const TileCastOut g8 = CastTiles(k::Fp8Concat::kCols, gs, gdtype, mp, torch::kFloat8_e5m2, want_dx, want_dw,
                                   k::Fp8ScaleFrom::kCompute, x8.data);
  torch::Tensor dx;
  if (want_dx) {
    const TileCastOut wt8 = CastTiles(k::Fp8Concat::kRows, ws, saved[first + 2].scalar_type(), 0,
                                      torch::kFloat8_e4m3fn, false, true, k::Fp8ScaleFrom::kGiven, x8.data);
    dx = MatmulNT(g8.rows, wt8.cols, dtype).narrow(0, 0, m);  // [mp, sum N] x [in, sum N]^T
  }
  if (want_dw) {
    const auto dw = MatmulNT(g8.cols, Transposed(x8), dtype);  // [sum N, mp] x [in, mp]^T = [sum N, in]
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (ctx->needs_input_grad(dw_slot + i)) (*out)[dw_slot + i] = dw.narrow(0, at, widths[i]);
      at += widths[i];
    }
  }
  return dx;
}

// An FP8 tensor of `rows` x `cols` with rows padded to a multiple of 16 (zero bytes, FP8 zero), and its
// [amax, scale_inv] buffer.
Fp8Tensor MakePadded(int64_t rows, int64_t cols, const torch::Tensor& like, torch::Tensor* stats) {
  const int64_t rp = RoundUp(rows);
  *stats = NewStats(like);
  auto data = torch::empty({rp, cols}, like.options().dtype(torch::kFloat8_e4m3fn));
  if (rp > rows) data.narrow(0, rows, rp - rows).view(torch::kUInt8).zero_();
  return {data, stats->select(0, kScaleInvAt)};
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
  const cudaError_t e = cast(static_cast<uint8_t*>(y8.data.data_ptr()), AmaxPtr(stats),
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
                                                   rstd.data_ptr<float>(), out, stats, stats + kScaleInvAt, stream);
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
                                                  gate.data_ptr(), up.data_ptr(), gate.numel(), out, stats, stats + kScaleInvAt,
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

torch::Tensor MatmulNT(const Fp8Tensor& a, const Fp8Tensor& b, torch::ScalarType out_dtype, bool fast_accum) {
  TORCH_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(1),
              "fp8 matmul: a [M, K] and b [N, K] (got ", a.data.sizes(), " and ", b.data.sizes(), ")");
  TORCH_CHECK(a.data.size(1) % kAlign == 0 && b.data.size(0) % kAlign == 0,
              "fp8 matmul: K and N must be multiples of 16 (got K ", a.data.size(1), ", N ", b.data.size(0), ")");
  TORCH_CHECK(!(a.data.scalar_type() == torch::kFloat8_e5m2 && b.data.scalar_type() == torch::kFloat8_e5m2),
              "fp8 matmul: E5M2 x E5M2 is not supported by cuBLASLt");
  // b.t() is b^T in column-major order, the layout cuBLASLt's FP8 GEMM takes for its second operand.
  // cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED) a scale pointer that is not 16-byte aligned; ours sit
  // 16 bytes into their stats buffer (NewStats), and any other gets a copy of its own.
  auto aligned = [](const torch::Tensor& s) {
    return reinterpret_cast<uintptr_t>(s.data_ptr()) % 16 == 0 ? s : s.clone();
  };
  return at::_scaled_mm(a.data.contiguous(), b.data.contiguous().t(), aligned(a.scale_inv), aligned(b.scale_inv),
                        std::nullopt, std::nullopt, out_dtype, fast_accum);
}

Fp8Tensor WeightCache::Cast(const torch::Tensor& w_in) {
  torch::NoGradGuard no_grad;
  const auto w = w_in.contiguous();
  Entry& e = entries_[w_in.unsafeGetTensorImpl()];
  if (!e.stats.defined()) e.stats = NewStats(w);
  if (e.generation != generation_) {  // the first cast after a step: the amax too, in the same launch
    Fp8Tensor w8{torch::empty(w.sizes(), w.options().dtype(torch::kFloat8_e4m3fn)), e.stats.select(0, kScaleInvAt)};
    QuantizeInto(w, w8.data, e.stats);
    e.generation = generation_;
    return w8;
  }
  // The amax of this step is known: one read of the weight, one write of its bytes.
  return CastTiles(k::Fp8Concat::kRows, {SourceOf(w, AmaxPtr(e.stats))}, w.scalar_type(), 0, torch::kFloat8_e4m3fn,
                   true, false, k::Fp8ScaleFrom::kGiven, w)
      .rows;
}

torch::Tensor WeightCache::Stats(const torch::Tensor& w) const {
  auto it = entries_.find(w.unsafeGetTensorImpl());
  TORCH_CHECK(it != entries_.end() && it->second.generation == generation_,
              "fp8: the weight's amax is asked for before its cast in this step");
  return it->second.stats;
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
torch::Tensor MatmulNT(const Fp8Tensor&, const Fp8Tensor&, torch::ScalarType, bool) { Missing(); }
Fp8Tensor WeightCache::Cast(const torch::Tensor&) { Missing(); }
torch::Tensor WeightCache::Stats(const torch::Tensor&) const { Missing(); }
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
