#include "worker/engine/fp8_ops.h"

#include "absl/strings/str_cat.h"

#if FTD_HAVE_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAFunctions.h>

#include <mutex>

#include "kernels/fp8_cast.h"
#include "kernels/launch_plan.h"
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

// x (contiguous) cast into `data` (x's shape, an FP8 dtype) with stats = [amax, scale_inv] (fp32 [2]).
void QuantizeInto(const torch::Tensor& x, const torch::Tensor& data, const torch::Tensor& stats) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "fp8: the source must be a contiguous CUDA tensor");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat,
              "fp8: the source must be bf16 or fp32 (got ", x.scalar_type(), ")");
  const k::DType dt = x.scalar_type() == torch::kFloat ? k::DType::kF32 : k::DType::kBF16;
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

// Inputs (flattened by LibTorch): x, then n weights, then the cache's address; outputs: n projections.
struct LinearsFn : public torch::autograd::Function<LinearsFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList ws, int64_t cache_addr) {
    auto* cache = reinterpret_cast<WeightCache*>(cache_addr);
    const int64_t n = static_cast<int64_t>(ws.size()), in = x.size(-1), m = x.numel() / in, mp = RoundUp(m);
    // Rows padded to a multiple of 16 (only odd token counts): the padding rows are zeros, which change
    // neither the amax nor, in backward, any sum over rows.
    const Fp8Tensor x8 = Quantize(PadRows(x.reshape({m, in}), mp), torch::kFloat8_e4m3fn);
    variable_list out, saved = {x8.data, x8.scale_inv};
    auto shape = x.sizes().vec();
    for (int64_t i = 0; i < n; ++i) {
      const Fp8Tensor& w8 = cache->Get(ws[i]);
      auto y = MatmulNT(x8, w8, x.scalar_type());
      shape.back() = ws[i].size(0);
      out.push_back(y.narrow(0, 0, m).view(shape));
      saved.push_back(w8.data);
      saved.push_back(w8.scale_inv);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["n"] = n;
    ctx->saved_data["m"] = m;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["dtype"] = x.scalar_type();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t n = ctx->saved_data["n"].toInt(), m = ctx->saved_data["m"].toInt();
    const auto dtype = ctx->saved_data["dtype"].toScalarType();
    const Fp8Tensor x8{saved[0], saved[1]};
    const int64_t mp = x8.data.size(0), in = x8.data.size(1);
    const bool want_dx = ctx->needs_input_grad(0);
    // dx = sum_i dy_i W_i, accumulated in fp32 when there are several projections.
    const auto dx_dtype = n > 1 ? torch::kFloat : dtype;
    torch::Tensor dx;
    Fp8Tensor x8t;  // [in, mp]: the second operand of every dW
    variable_list out(static_cast<size_t>(n + 2));
    for (int64_t i = 0; i < n; ++i) {
      if (!grads[i].defined()) continue;  // an unused projection contributes nothing
      const Fp8Tensor w8{saved[2 + 2 * i], saved[3 + 2 * i]};
      const Fp8Tensor g8 = Quantize(PadRows(grads[i].reshape({m, -1}), mp), torch::kFloat8_e5m2);  // [mp, N]
      if (want_dx) {
        auto part = MatmulNT(g8, Transposed(w8), dx_dtype);  // [mp, N] x [N, in]
        dx = dx.defined() ? dx.add_(part) : part;
      }
      if (ctx->needs_input_grad(1 + i)) {
        if (!x8t.data.defined()) x8t = Transposed(x8);
        out[1 + i] = MatmulNT(Transposed(g8), x8t, dtype);  // [N, mp] x [mp, in]
      }
    }
    if (want_dx) {
      if (!dx.defined()) dx = torch::zeros({mp, in}, x8.data.options().dtype(dtype));
      out[0] = dx.narrow(0, 0, m).to(dtype).view(ctx->saved_data["x_shape"].toIntVector());
    }
    return out;  // the last entry, for the cache's address, stays undefined
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

#endif

}  // namespace ftd::engine::fp8
