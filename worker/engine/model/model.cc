// The LLaMA model's computation (model.h): rotary embeddings, the decoder layer (attention with a
// block-diagonal mask for packed rows, SwiGLU MLP, RMSNorm) on the kernel set chosen per op, the
// projections (fused where their weights are shared, LoRA where adapted), activation checkpointing,
// and the losses and logits. Its parameters are built, loaded and written in model_weights.cc.
#include "worker/engine/model/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numbers>

#include <ATen/record_function.h>

#include "absl/strings/str_cat.h"
#include "worker/engine/model/fused_ops.h"
#include "worker/engine/model/recompute.h"
#include "worker/engine/core/safetensors.h"
#include "worker/engine/torch_util.h"

namespace ftd::engine {

torch::Tensor RopeInvFreq(const LlamaConfig& c) {
  const int64_t dim = c.head_dim;
  auto idx = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat);
  auto inv_freq = 1.0 / torch::pow(torch::tensor(c.rope_theta, torch::kFloat), idx / static_cast<double>(dim));
  if (c.rope_scaling.type != "llama3") return inv_freq;
  const auto& r = c.rope_scaling;
  const double old_len = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / r.low_freq_factor;
  const double high_freq_wavelen = old_len / r.high_freq_factor;
  auto wavelen = 2 * std::numbers::pi / inv_freq;
  auto llama = torch::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  auto smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  auto smoothed = (1 - smooth) * llama / r.factor + smooth * llama;
  auto medium = torch::logical_not(wavelen < high_freq_wavelen) * torch::logical_not(wavelen > low_freq_wavelen);
  return torch::where(medium, smoothed, llama);
}

std::pair<torch::Tensor, torch::Tensor> LlamaModel::RopeCosSin(int64_t seq_len) {
  if (rope_len_ != seq_len) {
    auto pos = torch::arange(seq_len, torch::TensorOptions().dtype(torch::kFloat).device(device_));
    auto freqs = torch::outer(pos, inv_freq_);             // [T, D/2]
    auto emb = torch::cat({freqs, freqs}, -1);             // [T, D]
    cos_ = emb.cos().to(dtype_);
    sin_ = emb.sin().to(dtype_);
    cos32_ = freqs.cos().contiguous();
    sin32_ = freqs.sin().contiguous();
    rope_len_ = seq_len;
  }
  return {cos_, sin_};
}

namespace {

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  auto xf = x.to(torch::kFloat);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return w * (xf * torch::rsqrt(var + eps)).to(x.scalar_type());
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

}  // namespace

torch::Tensor LlamaModel::Norm(const torch::Tensor& x, const torch::Tensor& w) const {
  RECORD_USER_SCOPE("ftd::op::rmsnorm");  // profiles attribute these ops to their family
  return kernels_[KernelOp::kRmsNorm] ? fused::RmsNorm(x, w, config_.rms_norm_eps) : RmsNorm(x, w, config_.rms_norm_eps);
}

torch::Tensor LlamaModel::SwiGlu(const torch::Tensor& gate, const torch::Tensor& up) const {
  RECORD_USER_SCOPE("ftd::op::swiglu");
  return kernels_[KernelOp::kSwiGlu] ? fused::SwiGlu(gate, up) : torch::silu(gate) * up;
}

PackedLayout PackedLayout::FromSegments(const torch::Tensor& positions, const torch::Tensor& segments) {
  const int64_t T = segments.size(1);
  auto causal = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(segments.device())).tril();
  auto same = segments.unsqueeze(2).eq(segments.unsqueeze(1));  // [B, T, T]
  return {positions, same.logical_and(causal).unsqueeze(1)};
}

torch::Tensor LlamaModel::Rotate(const torch::Tensor& x, int64_t seq_len, const PackedLayout& layout) {
  auto [cos, sin] = RopeCosSin(seq_len);  // [T, D], broadcast over [B, H, T, D]
  RECORD_USER_SCOPE("ftd::op::rope");
  if (layout.packed()) {
    // Each token's own position: rows of the tables gathered per token.
    const auto B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
    const auto pos = layout.positions.reshape({-1});
    if (kernels_[KernelOp::kRope]) {
      // The kernel takes one table row per sequence position: all B*T tokens as one sequence.
      auto flat = fused::Rope(x.reshape({1, B * T, H, D}), cos32_.index_select(0, pos).contiguous(),
                              sin32_.index_select(0, pos).contiguous());
      return flat.view({B, T, H, D}).transpose(1, 2);
    }
    auto c = cos.index_select(0, pos).view({B, 1, T, D});
    auto s = sin.index_select(0, pos).view({B, 1, T, D});
    auto t = x.transpose(1, 2);
    return t * c + RotateHalf(t) * s;
  }
  if (kernels_[KernelOp::kRope]) return fused::Rope(x, cos32_, sin32_).transpose(1, 2);
  auto t = x.transpose(1, 2);
  return t * cos + RotateHalf(t) * sin;
}

void LlamaModel::SetKernels(const KernelChoice& k, const spec::KernelTuning& tuning) {
  kernels_ = k;
  tuning_ = tuning;
  fp8_weights_.set_fast_accum_forward(tuning.fp8_fast_accum);
  if (tuning.fused_projections && !fused_projections_) FuseProjectionWeights();
}

void LlamaModel::FuseProjectionWeights() {
  torch::NoGradGuard no_grad;
  auto fuse = [&](std::vector<torch::Tensor*> ws) {
    std::vector<torch::Tensor> parts;
    for (auto* w : ws) parts.push_back(*w);
    auto buffer = torch::cat(parts, 0);
    int64_t row = 0;
    for (auto* w : ws) {
      // A leaf of its own (the optimizer's and the checkpoints' parameter) on the buffer's rows.
      auto block = buffer.narrow(0, row, w->size(0)).detach();
      block.set_requires_grad(w->requires_grad());
      row += w->size(0);
      for (auto& [name, t] : params_) {
        if (t.is_same(*w)) t = block;
      }
      *w = block;
    }
  };
  for (auto& L : layers_) {
    fuse({&L.q, &L.k, &L.v});
    fuse({&L.gate, &L.up});
  }
  fused_projections_ = true;
}

namespace {

// Weights whose rows lie back to back in one storage (FuseProjectionWeights) as one [sum of rows, in]
// tensor, without a copy; backward gives each weight its rows of the gradient.
struct ConcatRowsFn : public torch::autograd::Function<ConcatRowsFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList ws) {
    const auto& w0 = ws[0];
    std::vector<int64_t> rows;
    int64_t total = 0;
    for (const auto& w : ws) {
      TORCH_CHECK(w.is_contiguous() && w.size(1) == w0.size(1) && w.storage().is_alias_of(w0.storage()) &&
                      w.storage_offset() == w0.storage_offset() + total * w0.size(1),
                  "fused projections: the weights are not consecutive rows of one buffer");
      rows.push_back(w.size(0));
      total += w.size(0);
    }
    auto all = torch::empty({0}, w0.options());
    all.set_(w0.storage(), w0.storage_offset(), {total, w0.size(1)}, {w0.size(1), 1});
    ctx->saved_data["rows"] = rows;
    return all;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto rows = ctx->saved_data["rows"].toIntVector();
    auto parts = grads[0].contiguous().split_with_sizes(rows, 0);
    return torch::autograd::variable_list(parts.begin(), parts.end());
  }
};

}  // namespace

torch::Tensor LlamaModel::Project(const torch::Tensor& x, const torch::Tensor& w, const LoraAdapter& ad,
                                  bool train) const {
  if (!ad.on()) return torch::linear(x, w);
  return LoraLinear(x, w, ad, lora_.Scale(), lora_.dropout, train);
}

bool LlamaModel::Fuses(const std::vector<torch::Tensor>& ws, const std::vector<const LoraAdapter*>& ads) const {
  // FP8 matmuls take the weights one by one (fp8_ops): their own grouping.
  return fused_projections_ && !kernels_[KernelOp::kMatmul] && ws.size() > 1 &&
         std::none_of(ads.begin(), ads.end(), [](const LoraAdapter* ad) { return ad->on(); });
}

torch::Tensor LlamaModel::ProjectFused(const torch::Tensor& x, const std::vector<torch::Tensor>& ws) const {
  return torch::linear(x, ConcatRowsFn::apply(at::TensorList(ws)));
}

torch::Tensor LlamaModel::SwiGluPacked(const torch::Tensor& y) const {
  RECORD_USER_SCOPE("ftd::op::swiglu");
  if (kernels_[KernelOp::kSwiGlu]) return fused::SwiGluPacked(y);
  auto parts = y.chunk(2, -1);
  return torch::silu(parts[0]) * parts[1];
}

std::vector<torch::Tensor> LlamaModel::ProjectShared(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                                                     const std::vector<const LoraAdapter*>& ads, bool train) const {
  if (kernels_[KernelOp::kMatmul]) {  // FP8 (no LoRA: validated)
    RECORD_USER_SCOPE("ftd::op::matmul");
    return fp8::Linears(x, ws, &fp8_weights_);
  }
  if (Fuses(ws, ads)) {
    // One GEMM over the concatenated weights; the outputs are column blocks of its result.
    std::vector<int64_t> cols;
    for (const auto& w : ws) cols.push_back(w.size(0));
    return ProjectFused(x, ws).split_with_sizes(cols, -1);
  }
  std::vector<torch::Tensor> out(ws.size());
  // The grouped function has no dropout: with lora.dropout > 0 the eager path runs.
  const bool grouped = lora_.enabled && kernels_[KernelOp::kLora] && !(lora_.dropout > 0 && train);
  std::vector<torch::Tensor> gw;
  std::vector<const LoraAdapter*> ga;
  std::vector<size_t> where;
  for (size_t i = 0; i < ws.size(); ++i) {
    if (grouped && ads[i]->on()) {
      gw.push_back(ws[i]);
      ga.push_back(ads[i]);
      where.push_back(i);
    } else {
      out[i] = Project(x, ws[i], *ads[i], train);
    }
  }
  if (!gw.empty()) {
    RECORD_USER_SCOPE("ftd::op::lora");
    auto ys = LoraLinearGroup(x, gw, ga, lora_.Scale());
    for (size_t j = 0; j < where.size(); ++j) out[where[j]] = ys[j];
  }
  return out;
}

torch::Tensor LlamaModel::DecoderLayer(const Layer& L, const torch::Tensor& x_in, bool train, bool selective,
                                       const PackedLayout& layout) {
  const auto& c = config_;
  const int64_t B = x_in.size(0), T = x_in.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  // Selective checkpointing: the norms' outputs and the SwiGLU product are recomputed in backward
  // from what their ops save anyway (the norm's input, gate and up).
  using spec::LoraTarget;
  auto lora = [&](LoraTarget t) -> const LoraAdapter& { return L.lora[static_cast<size_t>(t)]; };
  auto x = x_in;
  // FP8 matmuls after the fused norm and SwiGLU: their outputs are written in E4M3 by those kernels
  // (fp8::NormLinears, fp8::SwiGluLinears), never in bf16, so selective checkpointing has nothing to free.
  const bool fp8_norm = kernels_[KernelOp::kMatmul] && kernels_[KernelOp::kRmsNorm];
  const bool fp8_swiglu = kernels_[KernelOp::kMatmul] && kernels_[KernelOp::kSwiGlu];
  auto norm_then = [&](const torch::Tensor& w, const std::vector<torch::Tensor>& ws,
                       const std::vector<const LoraAdapter*>& ads) {
    if (fp8_norm) {
      RECORD_USER_SCOPE("ftd::op::matmul");
      return fp8::NormLinears(x, w, config_.rms_norm_eps, ws, &fp8_weights_);
    }
    auto h = Norm(x, w);
    auto ys = ProjectShared(h, ws, ads, train);
    if (selective) RecomputeInBackward(h, ys, [this, x, w] { return Norm(x, w); });
    return ys;
  };
  auto qkv = norm_then(L.input_norm, {L.q, L.k, L.v},
                       {&lora(LoraTarget::kQ), &lora(LoraTarget::kK), &lora(LoraTarget::kV)});
  auto q = Rotate(qkv[0].view({B, T, c.num_attention_heads, c.head_dim}), T, layout);
  auto k = Rotate(qkv[1].view({B, T, c.num_key_value_heads, c.head_dim}), T, layout);
  auto v = qkv[2].view({B, T, c.num_key_value_heads, c.head_dim}).transpose(1, 2);
  // Packed rows: the block-diagonal causal mask (SDPA's memory-efficient or math kernel);
  // otherwise the causal flag (flash attention where available).
  auto a = layout.packed()
               ? at::scaled_dot_product_attention(q, k, v, layout.mask, /*dropout_p=*/0.0, /*is_causal=*/false, scale,
                                                  /*enable_gqa=*/c.num_key_value_heads != c.num_attention_heads)
               : at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/T > 1,
                                                  scale, /*enable_gqa=*/c.num_key_value_heads != c.num_attention_heads);
  a = a.transpose(1, 2).reshape({B, T, c.num_attention_heads * c.head_dim});
  x = x + ProjectShared(a, {L.o}, {&lora(LoraTarget::kO)}, train)[0];
  const std::vector<const LoraAdapter*> gate_up_ads = {&lora(LoraTarget::kGate), &lora(LoraTarget::kUp)};
  // Fused projections: SwiGLU reads the one GEMM's [gate | up] output in place.
  const bool packed = Fuses({L.gate, L.up}, gate_up_ads);
  std::vector<torch::Tensor> gate_up;
  if (packed) {
    auto h = Norm(x, L.post_norm);
    gate_up = {ProjectFused(h, {L.gate, L.up})};
    if (selective) RecomputeInBackward(h, gate_up, [this, x, w = L.post_norm] { return Norm(x, w); });
  } else {
    gate_up = norm_then(L.post_norm, {L.gate, L.up}, gate_up_ads);
  }
  if (fp8_swiglu) {
    RECORD_USER_SCOPE("ftd::op::matmul");
    return x + fp8::SwiGluLinears(gate_up[0], gate_up[1], {L.down}, &fp8_weights_)[0];
  }
  auto swiglu = [this, packed, gate_up] { return packed ? SwiGluPacked(gate_up[0]) : SwiGlu(gate_up[0], gate_up[1]); };
  auto s = swiglu();
  auto down = ProjectShared(s, {L.down}, {&lora(LoraTarget::kDown)}, train);
  if (selective) RecomputeInBackward(s, down, swiglu);
  return x + down[0];
}

torch::Tensor LlamaModel::Hidden(const torch::Tensor& ids, bool train, const PackedLayout& layout) {
  auto x = torch::embedding(embed_, ids);
  const bool grad = train && at::GradMode::is_enabled();
  const bool selective = train && activation_checkpointing_ == spec::ActivationCheckpointing::kSelective;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& L = layers_[i];
    const bool full = grad && (activation_checkpointing_ == spec::ActivationCheckpointing::kFull ||
                               static_cast<int64_t>(i) < full_checkpoint_layers_);
    if (!full) {
      x = DecoderLayer(L, x, train, selective, layout);
      continue;
    }
    // Full checkpointing: only the layer's input is kept; backward reruns the layer (its LoRA
    // dropout masks drawn again from the forward's RNG state).
    std::vector<torch::Tensor> params;
    for (const auto& w : {L.input_norm, L.q, L.k, L.v, L.o, L.post_norm, L.gate, L.up, L.down}) {
      if (w.requires_grad()) params.push_back(w);
    }
    for (const auto& ad : L.lora) {
      if (ad.on()) {
        params.push_back(ad.a);
        params.push_back(ad.b);
      }
    }
    x = Checkpointed(
        x, params,
        [this, &L, train, layout](const torch::Tensor& in) { return DecoderLayer(L, in, train, false, layout); },
        /*preserve_rng=*/lora_.enabled && lora_.dropout > 0);
  }
  return Norm(x, final_norm_);
}

torch::Tensor LlamaModel::Logits(const torch::Tensor& ids, const PackedLayout& layout) {
  return torch::linear(Hidden(ids, /*train=*/false, layout), lm_head_);
}

torch::Tensor LlamaModel::LossSum(const torch::Tensor& ids, const torch::Tensor& labels, const PackedLayout& layout) {
  const auto flat_labels = labels.reshape({-1});
  if (kernels_[KernelOp::kLinearCrossEntropy]) {
    auto one = torch::ones({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
    auto h = Hidden(ids, /*train=*/true, layout).reshape({-1, config_.hidden_size});
    RECORD_USER_SCOPE("ftd::op::cross_entropy");
    return fused::LinearCrossEntropy(h, lm_head_, flat_labels, one, kIgnoreIndex, tuning_.LinearCrossEntropyChunkRows());
  }
  return CrossEntropySum(torch::linear(Hidden(ids, /*train=*/true, layout), lm_head_), flat_labels);
}

torch::Tensor LlamaModel::CrossEntropySum(const torch::Tensor& logits, const torch::Tensor& flat_labels) const {
  auto flat = logits.view({-1, config_.vocab_size});
  RECORD_USER_SCOPE("ftd::op::cross_entropy");
  // The fused kernel reads the logits in the model dtype: no fp32 copy, no softmax tensor.
  if (kernels_[KernelOp::kCrossEntropy]) return fused::CrossEntropySum(flat, flat_labels, kIgnoreIndex);
  return torch::nn::functional::cross_entropy(
      flat.to(torch::kFloat), flat_labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

torch::Tensor LlamaModel::EvalLossSum(const torch::Tensor& ids, const torch::Tensor& labels,
                                      const PackedLayout& layout) {
  torch::NoGradGuard no_grad;
  const int64_t B = ids.size(0);
  auto total = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  // A row at a time: the logits of one row, not of the batch, are alive at once.
  for (int64_t b = 0; b < B; ++b) {
    PackedLayout row;
    if (layout.packed()) row = {layout.positions.slice(0, b, b + 1), layout.mask.slice(0, b, b + 1)};
    auto h = Hidden(ids.slice(0, b, b + 1), /*train=*/false, row);
    total += CrossEntropySum(torch::linear(h, lm_head_), labels.slice(0, b, b + 1).reshape({-1}));
  }
  return total;
}

torch::Tensor LlamaModel::LossMean(const torch::Tensor& ids, const torch::Tensor& labels, const torch::Tensor& count,
                                   const PackedLayout& layout) {
  if (kernels_[KernelOp::kLinearCrossEntropy]) {
    auto h = Hidden(ids, /*train=*/true, layout).reshape({-1, config_.hidden_size});
    RECORD_USER_SCOPE("ftd::op::cross_entropy");
    return fused::LinearCrossEntropy(h, lm_head_, labels.reshape({-1}), count.reciprocal(), kIgnoreIndex,
                                     tuning_.LinearCrossEntropyChunkRows());
  }
  return LossSum(ids, labels, layout) / count;
}

double LlamaModel::TrainingFlopsPerToken(int64_t seq_len) const {
  const auto& c = config_;
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(c.intermediate_size);
  const double matmul_params =
      static_cast<double>(c.num_hidden_layers) * (h * (q + 2 * kv) + q * h + 3 * h * f) +
      static_cast<double>(c.vocab_size) * h;
  // 6 FLOPs per matmul weight per token (forward 2, backward 4), plus causal attention:
  // QK^T and PV are 2 * 2 * T * q FLOPs per token and layer forward, halved by the causal mask, x3 for training.
  const double attention = 6.0 * static_cast<double>(c.num_hidden_layers) * q * static_cast<double>(seq_len);
  if (lora_.enabled) {
    // A frozen weight costs its forward (2) and the input's gradient (2), no weight gradient; the
    // adapters cost 6 per weight as any trained matmul.
    double adapter_params = 0;
    for (const auto& [name, t] : adapters_) adapter_params += static_cast<double>(t.numel());
    return 4.0 * matmul_params + 6.0 * adapter_params + attention;
  }
  return 6.0 * matmul_params + attention;
}

}  // namespace ftd::engine
