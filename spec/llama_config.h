// The LLaMA family's architecture, read from and written to an HF config.json. No LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ftd::spec {

struct RopeScaling {
  std::string type;  // "" (none) or "llama3"
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA: num_attention_heads must be a multiple of it
  int64_t head_dim = 0;             // default hidden_size / num_attention_heads
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  std::string torch_dtype = "float32";  // recorded dtype of saved weights

  absl::Status Validate() const;
  // Parameters, counting tied embeddings once.
  int64_t NumParameters() const;
  // The JSON text of an HF config.json for LlamaForCausalLM.
  std::string ToJson() const;
};

// Whether a model with `c`'s positions takes rows of `seq_len` tokens: INVALID_ARGUMENT naming
// spec.seq_len and the largest that fits when seq_len is above max_position_embeddings. Refused, not
// warned about: the RoPE types ftd runs (none, llama3) do not extend a model past
// max_position_embeddings (llama3's scaling is what already took it there), so positions beyond it
// are ones the model never saw. `source` says where the model came from ("its config.json").
absl::Status CheckSequenceLength(const LlamaConfig& c, int64_t seq_len, const std::string& source);

// Parses config.json text. Accepts both the `rope_theta` + `rope_scaling` keys and the newer
// `rope_parameters` object.
absl::StatusOr<LlamaConfig> ParseLlamaConfig(const std::string& json_text);
// Reads `path` (a config.json, or a directory that holds one).
absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& path);
// Named presets: "llama-3.1-8b" (Meta-Llama-3.1-8B's config.json) and "tiny".
absl::StatusOr<LlamaConfig> PresetLlamaConfig(const std::string& name);

}  // namespace ftd::spec
