// The fp8 kernel set's matmuls (docs/kernels.md, "FP8"): the decoder layers' linear projections in
// FP8 on the tensor cores through cuBLASLt (LibTorch's _scaled_mm), bf16 output, fp32 accumulation.
//
// Recipe: per-tensor current scaling. Forward: activations and weights in E4M3, each tensor cast with
// the scale its own amax gives (kernels/fp8_cast.h, amax and cast in one launch). Backward: the output
// gradient in E5M2 (gradients have a wider range and need less precision), multiplied with the E4M3
// weights (dX) and the E4M3 input saved by the forward (dW); E5M2 x E5M2 is never needed. A projection
// group's backward (q/k/v, gate/up) is one GEMM for dX and one for the stacked dWs: its output gradients
// are cast into one E5M2 matrix and its weights into one transposed E4M3 matrix (kernels/fp8_tiles.h).
// A weight's amax is computed once per optimizer step (WeightCache); its E4M3 copies are made where
// used, in forward and (transposed) in backward, and never kept from one to the other. Master weights,
// optimizer state and checkpoints stay as configured (bf16/fp32).
//
// Internal to the engine (LibTorch). Built without the kernels, every entry point fails with a message.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/spec_types.h"

namespace ftd::engine::fp8 {

// An FP8 tensor and its dequantization factor: value ~ data * scale_inv.
struct Fp8Tensor {
  torch::Tensor data;       // torch::kFloat8_e4m3fn or kFloat8_e5m2, the source's shape, contiguous
  torch::Tensor scale_inv;  // fp32, one element, on the same device
};

// x (bf16 or fp32, CUDA) cast to `dtype` (kFloat8_e4m3fn or kFloat8_e5m2) with per-tensor current
// scaling: scale = fp8_max / amax(x), saturating, NaN/Inf kept non-finite.
Fp8Tensor Quantize(const torch::Tensor& x, torch::ScalarType dtype);

// (a * a.scale_inv) (b * b.scale_inv)^T in `out_dtype`: a [M, K] and b [N, K] both row-major (b as a
// linear layer's weight is stored). K and N must be multiples of 16 (cuBLASLt); E5M2 may be on one side
// only. fp32 accumulation; with fast_accum, the tensor cores' partial sums are not promoted to fp32
// between K blocks (faster, less precise over long K).
torch::Tensor MatmulNT(const Fp8Tensor& a, const Fp8Tensor& b, torch::ScalarType out_dtype, bool fast_accum = false);

// The weights' amax for the model's FP8 matmuls: computed at a weight's first cast after Invalidate()
// (the trainer invalidates after each optimizer step, and after a checkpoint load) and reused by every
// later cast of the same step (another micro-batch, a recomputed forward, the transposed cast in
// backward), so every E4M3 copy of a weight in one step has the same scale. The copies themselves are
// not kept: 7 GB for the 8B model, which would otherwise sit through the activation peak.
class WeightCache {
 public:
  // A new E4M3 copy of w [N, K] (row-major, the GEMMs' second operand), scaled by this step's amax.
  Fp8Tensor Cast(const torch::Tensor& w);
  // w's [amax, ..., scale_inv, ...] buffer (amax at element 0) of this step; w must have been Cast.
  torch::Tensor Stats(const torch::Tensor& w) const;
  void Invalidate() { ++generation_; }
  // The forward GEMMs with fast accumulation (spec.kernel_tuning.fp8_fast_accum); the backward's never.
  void set_fast_accum_forward(bool on) { fast_accum_forward_ = on; }
  bool fast_accum_forward() const { return fast_accum_forward_; }

 private:
  struct Entry {
    torch::Tensor stats;  // fp32 [8]: amax at 0, scale_inv at 4 (16-byte aligned for cuBLASLt)
    uint64_t generation = 0;
  };
  std::unordered_map<const void*, Entry> entries_;  // by the weight's TensorImpl
  uint64_t generation_ = 1;
  bool fast_accum_forward_ = false;
};

// y_i = x W_i^T for each weight (the projections of one input: q/k/v, gate/up, or one), in FP8, as one
// autograd function: x is cast once, and saved for backward in E4M3 (half the bytes of bf16). x: [..., K]
// bf16; ws: [N_i, K]. Gradients: dx (sum over i, accumulated in fp32) and dW_i in x's dtype.
std::vector<torch::Tensor> Linears(const torch::Tensor& x, const std::vector<torch::Tensor>& ws, WeightCache* cache);

// Linears(RmsNorm(x, norm_w, eps), ws) with the norm's output written directly in E4M3 by the norm's
// kernel (kernels::RmsNormFp8: amax and cast in the same launch, current scaling), never in bf16. Saves x,
// rstd and the E4M3 output; gradients for x, norm_w and the weights.
std::vector<torch::Tensor> NormLinears(const torch::Tensor& x, const torch::Tensor& norm_w, double eps,
                                       const std::vector<torch::Tensor>& ws, WeightCache* cache);

// Linears(silu(gate) * up, ws) with the product written directly in E4M3 (kernels::SwiGluFp8). Saves gate,
// up and the E4M3 product; gradients for gate, up and the weights.
std::vector<torch::Tensor> SwiGluLinears(const torch::Tensor& gate, const torch::Tensor& up,
                                         const std::vector<torch::Tensor>& ws, WeightCache* cache);

// Whether the model's projections fit the FP8 GEMM: every in/out width a multiple of 16.
absl::Status CheckShapes(const LlamaConfig& c);

}  // namespace ftd::engine::fp8
