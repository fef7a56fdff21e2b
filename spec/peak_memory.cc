#include "spec/peak_memory.h"
#include "spec/bytes.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_format.h"

namespace ftd::spec {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

double PeakMemory::Peak() const {
  // `head` holds the larger of the loss head's transients; `activations` what is saved at the end of
  // the forward pass. The optimizer step holds the gradients but no activations.
  return weights + optimizer + other + std::max(activations + head, gradients);
}

std::string PeakMemory::ToString() const {
  return absl::StrCat("peak ", FormatBytes(Peak()), ": weights ", FormatBytes(weights), ", optimizer state ",
                      FormatBytes(optimizer), ", gradients ", FormatBytes(gradients), ", activations ",
                      FormatBytes(activations), ", loss head ", FormatBytes(head), ", other ", FormatBytes(other));
}

PeakMemory PredictPeakMemory(const LlamaConfig& m, const TrainConfig& c, bool gpu) {
  const bool bf16 = c.dtype == "bf16" || (c.dtype == "auto" && gpu);
  const double e = bf16 ? 2 : 4;  // bytes per element of the base
  const KernelChoice k = c.Kernels();
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.intermediate_size);
  const double heads = static_cast<double>(m.num_attention_heads);
  const double q = heads * static_cast<double>(m.head_dim);
  const double kv = static_cast<double>(m.num_key_value_heads * m.head_dim);
  const double vocab = static_cast<double>(m.vocab_size), layers = static_cast<double>(m.num_hidden_layers);
  const double tokens = static_cast<double>(c.batch_size) * static_cast<double>(c.seq_len);
  const double params = static_cast<double>(m.NumParameters());
  const LoraConfig& lora = c.lora;
  const bool full = !lora.enabled;

  // Inputs and outputs of the seven projections, by LoraTarget.
  const std::array<double, kNumLoraTargets> in = {h, h, h, q, h, h, f};
  const std::array<double, kNumLoraTargets> out = {q, kv, kv, h, f, f, h};
  std::array<bool, kNumLoraTargets> on{};
  if (lora.enabled) on = lora.Targets();
  const double r = static_cast<double>(lora.rank);
  const double ea = lora.dtype == "bf16" ? 2 : 4;  // bytes per adapter element
  double adapter_params = 0;
  for (size_t t = 0; t < on.size(); ++t) {
    if (on[t]) adapter_params += layers * r * (in[t] + out[t]);
  }

  PeakMemory p;
  // ZeRO-1 (optimizer.shard_state): each rank keeps the AdamW state (and masters) of 1/gpus of them.
  const double shards = c.optimizer.shard_state ? std::max(1, c.gpus) : 1;
  if (lora.enabled) {
    p.weights = params * e + adapter_params * ea;
    p.optimizer = 2 * adapter_params * ea / shards;
    p.gradients = adapter_params * ea;
  } else {
    const bool masters = c.fp32_master_weights && bf16;
    p.weights = params * e + (masters ? 4 * params / shards : 0);
    p.optimizer = 2 * params * (masters ? 4 : e) / shards;
    p.gradients = params * e;
  }
  if (c.optimizer.shard_grads && c.optimizer.shard_state && c.gpus > 1 && c.grad_accum_steps == 1) {
    // ZeRO-2: each rank keeps the reduced gradients of its 1/gpus of the tensors, plus the buckets
    // whose reduce-scatter is in flight (at most two of about 256 MiB, docs/distributed.md). With
    // accumulation every gradient is kept until the last micro-batch.
    p.gradients = std::min(p.gradients, p.gradients / c.gpus + 2 * 256.0 * (1 << 20));
  }
  if (c.optimizer.overlap && c.grad_accum_steps == 1) {
    // Each group (a layer, or the embedding / lm_head alone) is updated and its gradients freed as
    // soon as they are final: the largest group's gradients at most. With accumulation every
    // gradient is kept until the last micro-batch.
    const double layer = lora.enabled ? adapter_params / layers * ea
                                      : (h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h) * e;
    p.gradients = std::min(p.gradients, std::max(layer, full ? vocab * h * e : 0.0));
  }
  if (full && c.fp32_master_weights && bf16 && !k[KernelOp::kAdamW]) {
    // LibTorch's AdamW (eager) updates fp32 masters from an fp32 copy of each gradient, taken at the
    // step for every tensor this rank updates (under overlap, for one group at a time); the fused
    // kernel reads the bf16 gradients.
    p.gradients += c.optimizer.overlap && c.grad_accum_steps == 1 ? p.gradients * 4 / e : 4 * params / shards;
  }
  // FP8 matmuls (full fine-tuning) keep no copy of the weights: each group's E4M3 weights are cast
  // when used and freed after. What they save for backward is their input in E4M3, 1 byte an element.
  const bool fp8 = k[KernelOp::kMatmul] && full;

  // What one layer saves for backward, per token (bytes). A frozen projection without an adapter
  // saves nothing (its input gradient needs only the weight); a trained weight saves its input; an
  // adapter saves its input in the adapters' dtype (eager: one copy per adapter when that differs
  // from the base's) or, grouped (fused lora op), the shared input once.
  const bool grouped = lora.enabled && k[KernelOp::kLora] && lora.dropout == 0;
  auto input_saved = [&](std::initializer_list<LoraTarget> group, double width) {
    bool any = false;
    double eager_copies = 0;
    for (auto t : group) {
      const auto i = static_cast<size_t>(t);
      any = any || on[i];
      if (on[i] && !grouped && ea != e) eager_copies += width * ea;
    }
    if (full) return width * (fp8 ? 1 : e);
    if (!any) return 0.0;
    return (grouped || ea == e) ? width * e : eager_copies;
  };
  double per_layer = 0;
  // RMSNorm, twice: fused saves its input; eager its input in fp32 (and the normalised x when the
  // norm's weight is trained).
  const double norm_saved = k[KernelOp::kRmsNorm] ? h * e : 4 * h + (full ? h * e : 0);
  per_layer += 2 * norm_saved;
  const double qkv_in = input_saved({LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV}, h);
  per_layer += qkv_in;
  // Attention (sdpa): q, k, v, its output (which is o_proj's input, a view) and the log-sum-exp.
  per_layer += (2 * q + 2 * kv) * e + heads * 4;
  if (!full && on[static_cast<size_t>(LoraTarget::kO)] && !grouped && ea != e) per_layer += q * ea;
  if (fp8) per_layer += q;  // o_proj's input in E4M3 beside attention's own output
  const double gate_up_in = input_saved({LoraTarget::kGate, LoraTarget::kUp}, h);
  per_layer += gate_up_in;
  // SwiGLU: fused saves gate and up; eager also silu(gate).
  per_layer += (k[KernelOp::kSwiGlu] ? 2 : 3) * f * e;
  const double down_in = input_saved({LoraTarget::kDown}, f);
  per_layer += down_in;
  // The adapters' rank-sized activations (grouped: fp32 when fp32 adapters sit on a bf16 base).
  for (size_t t = 0; t < on.size(); ++t) {
    if (on[t]) per_layer += r * (grouped && !(ea == 4 && e == 2 && gpu) ? e : ea);
  }
  double saved_per_layer = per_layer;
  switch (c.activation_checkpointing) {
    case ActivationCheckpointing::kNone:
      break;
    case ActivationCheckpointing::kSelective: {
      // The norms' outputs and the SwiGLU product are freed where what their consumers saved is that
      // very tensor (width * e; a copy in another dtype stays). Recomputing a norm output keeps the
      // norm's input alive, which the fused norm (and an fp32 eager one) saves anyway.
      const bool norm_input_kept = k[KernelOp::kRmsNorm] || e == 4;
      auto freed = [&](double saved, double width) { return saved == width * e ? saved : 0.0; };
      if (norm_input_kept) saved_per_layer -= freed(qkv_in, h) + freed(gate_up_in, h);
      saved_per_layer -= freed(down_in, f);
      break;
    }
    case ActivationCheckpointing::kFull:
      // Each layer's input only; in backward, one layer's activations are recomputed at a time.
      saved_per_layer = h * e;
      break;
  }
  // spec.full_checkpoint_layers: the first N layers keep their input only. They are rerun in
  // backward after every later layer's activations are freed, so a rerun layer adds to the peak only
  // when every layer is rerun (the last layer's rerun comes while all the inputs are still held).
  const bool all_full = c.activation_checkpointing == ActivationCheckpointing::kFull ||
                        static_cast<double>(c.full_checkpoint_layers) >= layers;
  const double full_layers = all_full ? layers : static_cast<double>(c.full_checkpoint_layers);
  const double recomputed = all_full ? per_layer : 0;
  p.activations = tokens * (full_layers * h * e + (layers - full_layers) * saved_per_layer + recomputed +
                            norm_saved /* the final norm */);

  // The loss head. A trained lm_head (full fine-tuning) adds its weight gradient.
  const double lm_grad = full ? vocab * h * e : 0;
  if (k[KernelOp::kLinearCrossEntropy]) {
    // Gradients computed in the forward pass and kept for backward (dx, dW), plus one chunk of
    // logits while it runs.
    const double chunk = std::min(tokens, 2048.0);
    p.activations += tokens * h * e + lm_grad;
    p.head = chunk * vocab * e;
  } else if (k[KernelOp::kCrossEntropy]) {
    // The logits are saved in the model dtype; backward writes their gradient, then lm_head's.
    p.activations += tokens * vocab * e + (full ? tokens * h * e : 0);
    p.head = tokens * vocab * e + lm_grad;
  } else {
    // Eager: the fp32 log-softmax is saved; its backward holds it, the incoming gradient and the
    // gradient it writes, all fp32 over the vocabulary.
    p.activations += tokens * vocab * 4 + (full ? tokens * h * e : 0);
    p.head = 8 * tokens * vocab + lm_grad;
  }

  // Every micro-batch's token ids (fetched before the step), rotary tables, cuBLAS workspaces.
  const double seq = static_cast<double>(c.seq_len);
  p.other = static_cast<double>(c.grad_accum_steps) * static_cast<double>(c.batch_size) * (seq + 1) * 8 +
            seq * static_cast<double>(m.head_dim) * (2 * e + 4) + (gpu ? 64.0 * 1024 * 1024 : 0);
  return p;
}

}  // namespace ftd::spec
