// The LLaMA model in LibTorch, with HF parameter names, so weights load from and save to HF
// safetensors. Internal to the engine: includes LibTorch, never protobuf or gRPC.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/model/fp8_ops.h"
#include "worker/engine/core/hf_model_files.h"
#include "worker/engine/model/lora.h"
#include "worker/engine/core/progress.h"
#include "worker/engine/spec_types.h"

namespace ftd::engine {

inline constexpr int64_t kIgnoreIndex = -100;

// Several documents packed in one row: each attends only to itself. Both undefined: one document
// per row, positions 0..T-1 and the plain causal mask.
struct PackedLayout {
  torch::Tensor positions;  // [B, T] int64: position within the token's document
  torch::Tensor mask;       // [B, 1, T, T] bool: true where query t may attend to key s
  bool packed() const { return positions.defined(); }
  // From per-position document indices within each row ([B, T] int64, on the model's device).
  static PackedLayout FromSegments(const torch::Tensor& positions, const torch::Tensor& segments);
};

class LlamaModel {
 public:
  // Random init as HF does: linear and embedding weights ~ N(0, initializer_range), norms = 1.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const LlamaConfig& config, torch::Device device,
                                                            torch::ScalarType dtype, uint64_t seed);

  const LlamaConfig& config() const { return config_; }
  torch::ScalarType dtype() const { return dtype_; }
  torch::Device device() const { return device_; }

  // Reads HF safetensors (single file or sharded) into the parameters, converting dtype. Checks
  // every name and shape; a missing tensor or a shape mismatch names the tensor. `progress`, when
  // given, has the bytes to read added to its total and counts them as they are copied.
  absl::Status LoadWeights(const std::string& dir, ProgressMeter* progress = nullptr);
  // Writes dir/model.safetensors (tied lm_head not stored) and the files of hf_files(): config.json,
  // generation_config.json and the tokenizer's, so the directory is a complete HF model.
  absl::Status SaveWeights(const std::string& dir, ProgressMeter* progress = nullptr) const;
  // What SaveWeights and SaveMerged write beside the weights (HfModelFiles::Read, at setup); by
  // default config.json from the architecture alone.
  void SetHfFiles(HfModelFiles files) { hf_files_ = std::move(files); }
  const HfModelFiles& hf_files() const { return hf_files_; }

  // The base weights under their HF names, in a fixed order (a tied lm_head is not listed).
  const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters() const { return params_; }
  // What the optimizer trains: the base weights, or with LoRA the adapters under PEFT's names.
  const std::vector<std::pair<std::string, torch::Tensor>>& trainable_parameters() const {
    return lora_.enabled ? adapters_ : params_;
  }

  // LoRA (spec.lora): freezes every base weight and adds adapters on the target projections, drawn
  // from `seed` as PEFT draws them, or read from lora.adapter_path. Call after LoadWeights.
  absl::Status EnableLora(const spec::LoraConfig& lora, uint64_t seed);
  bool lora() const { return lora_.enabled; }
  const spec::LoraConfig& lora_config() const { return lora_; }
  // LoRA: dir/adapter_model.safetensors + adapter_config.json in PEFT's format (its
  // base_model_name_or_path: the directory LoadWeights read, or null).
  absl::Status SaveAdapters(const std::string& dir, ProgressMeter* progress = nullptr) const;
  absl::Status LoadAdapters(const std::string& dir);
  // LoRA: dir/model.safetensors with every adapter merged (W + scale B A, in fp32, stored in the
  // model's dtype) and the files of hf_files(): a model transformers loads on its own.
  absl::Status SaveMerged(const std::string& dir, ProgressMeter* progress = nullptr) const;

  // ids: [B, T] int64 -> logits [B, T, V] in the model's dtype.
  torch::Tensor Logits(const torch::Tensor& ids, const PackedLayout& layout = {});
  // Sum over non-ignored positions of the next-token cross-entropy (fp32 scalar). labels: [B, T]
  // int64, already shifted (labels[b, t] is the target after ids[b, t]); kIgnoreIndex skipped.
  torch::Tensor LossSum(const torch::Tensor& ids, const torch::Tensor& labels, const PackedLayout& layout = {});
  // LossSum without autograd and without dropout: the held-out loss.
  torch::Tensor EvalLossSum(const torch::Tensor& ids, const torch::Tensor& labels, const PackedLayout& layout = {});
  // LossSum / count, with count an fp32 scalar tensor on the model's device (the step's non-ignored
  // tokens). The fused linear cross-entropy computes its gradients in the forward pass and needs the
  // 1/count weight up front.
  torch::Tensor LossMean(const torch::Tensor& ids, const torch::Tensor& labels, const torch::Tensor& count,
                         const PackedLayout& layout = {});

  // Which ops run ftd's fused CUDA kernels (default: none, LibTorch's composite ops), and their tuning.
  // With tuning.fused_projections, each layer's q/k/v weights and its gate/up weights move into one
  // buffer each (the named parameters become row blocks of it, so checkpoints keep HF's names):
  // call before LoadWeights, EnableLora and the optimizer, which hold the parameters.
  void SetKernels(const KernelChoice& k, const spec::KernelTuning& tuning = {});
  const KernelChoice& kernels() const { return kernels_; }
  // What each decoder layer keeps for backward (spec.activation_checkpointing); default none. The
  // first full_layers layers are fully checkpointed whatever `a` says (spec.full_checkpoint_layers).
  void SetActivationCheckpointing(spec::ActivationCheckpointing a, int32_t full_layers = 0) {
    activation_checkpointing_ = a;
    full_checkpoint_layers_ = full_layers;
  }
  // The weights changed in place (an optimizer step, a checkpoint load): FP8 copies are made again.
  void WeightsChanged() { fp8_weights_.Invalidate(); }

  // Multiply-accumulate FLOPs of one token's forward+backward (docs/performance.md, MFU).
  double TrainingFlopsPerToken(int64_t seq_len) const;

 private:
  struct Layer {
    torch::Tensor input_norm, q, k, v, o, post_norm, gate, up, down;
    LayerAdapters lora;  // by spec::LoraTarget; none without LoRA
    const torch::Tensor& Weight(spec::LoraTarget t) const;
  };
  LlamaModel(const LlamaConfig& c, torch::Device d, torch::ScalarType t) : config_(c), device_(d), dtype_(t) {}
  void Register(const std::string& name, torch::Tensor t);
  std::pair<torch::Tensor, torch::Tensor> RopeCosSin(int64_t seq_len);
  torch::Tensor Norm(const torch::Tensor& x, const torch::Tensor& w) const;
  torch::Tensor Rotate(const torch::Tensor& x_bthd, int64_t seq_len, const PackedLayout& layout);  // -> [B, H, T, D]
  torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up) const;
  // Sum of the cross-entropy over non-ignored labels; logits [..., V] in the model dtype.
  torch::Tensor CrossEntropySum(const torch::Tensor& logits, const torch::Tensor& flat_labels) const;
  torch::Tensor Hidden(const torch::Tensor& ids, bool train, const PackedLayout& layout);
  // One decoder layer: x [B, T, hidden] -> the residual stream after it.
  // selective: free the norms' outputs and the SwiGLU product, recomputed in backward.
  torch::Tensor DecoderLayer(const Layer& L, const torch::Tensor& x, bool train, bool selective,
                             const PackedLayout& layout);
  // x W^T for one of a layer's projections, plus its adapter's term with LoRA.
  torch::Tensor Project(const torch::Tensor& x, const torch::Tensor& w, const LoraAdapter& ad, bool train) const;
  // Several projections of one input (q/k/v, gate/up): with the fused lora op, every adapted one in
  // one grouped autograd function (lora.h), the others plain.
  std::vector<torch::Tensor> ProjectShared(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                                           const std::vector<const LoraAdapter*>& ads, bool train) const;
  // Fused projections: whether a group runs as one GEMM (no adapter on it), and that GEMM, whose
  // output is the outputs side by side.
  bool Fuses(const std::vector<torch::Tensor>& ws, const std::vector<const LoraAdapter*>& ads) const;
  torch::Tensor ProjectFused(const torch::Tensor& x, const std::vector<torch::Tensor>& ws) const;
  // SwiGLU of a [..., 2 * intermediate] gate|up output, read in place.
  torch::Tensor SwiGluPacked(const torch::Tensor& gate_up) const;
  absl::Status WriteWeights(const std::string& dir, bool merged, ProgressMeter* progress) const;
  // Moves q/k/v and gate/up of every layer into one buffer each (tuning.fused_projections).
  void FuseProjectionWeights();

  LlamaConfig config_;
  torch::Device device_;
  torch::ScalarType dtype_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  torch::Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  torch::Tensor inv_freq_;  // fp32, [head_dim / 2]
  int64_t rope_len_ = -1;
  torch::Tensor cos_, sin_;      // [T, D] in the model dtype (eager, as HF)
  torch::Tensor cos32_, sin32_;  // [T, D/2] fp32 (fused)
  KernelChoice kernels_;
  spec::KernelTuning tuning_;
  spec::ActivationCheckpointing activation_checkpointing_ = spec::ActivationCheckpointing::kNone;
  int32_t full_checkpoint_layers_ = 0;
  bool fused_projections_ = false;  // FuseProjectionWeights ran
  mutable fp8::WeightCache fp8_weights_;  // the projections' E4M3 copies (kernels.matmul fp8)
  spec::LoraConfig lora_;  // enabled: LoRA
  std::vector<std::pair<std::string, torch::Tensor>> adapters_;  // PEFT names, layer by layer, A then B
  std::string weights_dir_;  // what LoadWeights read
  HfModelFiles hf_files_;    // written beside the weights
};

// The architecture in `path` (an HF config.json, or a directory that holds one), read only if it is
// a regular file (fs_util's OpenRegularFile); every error starts with `field`, the spec field that
// named the path ("spec.model.config_path").
absl::StatusOr<LlamaConfig> ReadLlamaConfig(const std::string& path, std::string_view field);

// RoPE inverse frequencies, with llama3 scaling when configured (HF's _compute_llama3_parameters).
torch::Tensor RopeInvFreq(const LlamaConfig& c);

}  // namespace ftd::engine
