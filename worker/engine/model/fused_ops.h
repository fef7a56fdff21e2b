// The `fused` kernel set: autograd functions that run ftd's CUDA kernels (kernels/) in place of
// LibTorch's composite ops. Each turns tensors into launcher arguments (dtype, contiguity and device
// checked; the current CUDA stream) and wires the backward. Internal to the engine (LibTorch).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace ftd::engine::fused {

// Whether this build has the kernels (nvcc was present at build time).
bool Available();

// y = w * x / sqrt(mean(x^2) + eps) over the last dimension. x: [..., n], w: [n], same dtype.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps);
// RmsNorm's backward from dy and what its forward keeps (x contiguous, w, rstd [rows] fp32, as RmsNorm or
// kernels::RmsNormFp8 computes it): {dx, dw}.
std::pair<torch::Tensor, torch::Tensor> RmsNormBackward(const torch::Tensor& dy, const torch::Tensor& x,
                                                        const torch::Tensor& w, const torch::Tensor& rstd);
// Rotary embedding (HF rotate_half convention). x: [B, T, H, D] contiguous; cos, sin: [T, D/2] fp32.
torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
// silu(gate) * up, elementwise; same shape and dtype.
torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up);
// SwiGlu's backward from dout and its contiguous inputs: {dgate, dup}.
std::pair<torch::Tensor, torch::Tensor> SwiGluBackward(const torch::Tensor& dout, const torch::Tensor& gate,
                                                       const torch::Tensor& up);
// The same for gate_up [..., 2f] holding gate and up side by side in each row (a fused gate|up GEMM's
// output), read in place -> [..., f]; backward writes the gradient of gate_up in one buffer.
torch::Tensor SwiGluPacked(const torch::Tensor& gate_up);
// Sum over rows whose label is not ignore_index of the cross-entropy of logits [N, V] (fp32 scalar),
// online softmax, no fp32 copy of the logits and no softmax tensor.
torch::Tensor CrossEntropySum(const torch::Tensor& logits, const torch::Tensor& labels, int64_t ignore_index);
// scale * the same sum for logits = x W^T, without materialising them: x [N, H], w [V, H] (lm_head),
// in chunks of chunk_rows rows (spec.kernel_tuning); scale is an fp32 scalar on the device (1/count
// for a mean), known before the gradients, which are computed in the forward pass.
torch::Tensor LinearCrossEntropy(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& labels,
                                 const torch::Tensor& scale, int64_t ignore_index, int64_t chunk_rows);

// The global L2 norm of all gradients (fp32 scalar on the device), one deterministic multi-tensor pass.
torch::Tensor GradNorm(const std::vector<torch::Tensor>& grads);

// AdamW over many tensors in one multi-tensor kernel (torch.optim.AdamW semantics). Every list has
// one entry per parameter; masters empty when there are no fp32 master weights. `step`: fp32 scalar
// on the device holding this update's 1-based count; `grad_scale` (may be undefined): gradients are
// multiplied by it first (clipping); `found_inf`: non-zero skips the whole update.
struct AdamWHyper {
  double lr, beta1, beta2, eps;
};
void AdamWStep(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& masters,
               const std::vector<torch::Tensor>& grads, const std::vector<torch::Tensor>& exp_avgs,
               const std::vector<torch::Tensor>& exp_avg_sqs, const std::vector<double>& weight_decays,
               const AdamWHyper& h, const torch::Tensor& step, const torch::Tensor& grad_scale,
               const torch::Tensor& found_inf);

}  // namespace ftd::engine::fused
