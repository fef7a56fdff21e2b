// What makes a directory of weights a complete HF model directory, besides model.safetensors:
// config.json with every field of the base model's (bos_token_id, eos_token_id and the rest),
// generation_config.json, and the tokenizer files. Read once when a run is set up, from where the
// model and the tokenizer came; written beside the weights of every full checkpoint and of every
// merged LoRA model (docs/checkpoint-format.md). No LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/llama_config.h"

namespace ftd::engine {

// Where a run's model and tokenizer came from.
struct HfModelSources {
  // The base's config.json (a file, or a directory holding one) and the spec field that named it;
  // empty for a preset. generation_config.json is looked for beside it.
  std::string config_path;
  std::string config_field;
  // The directory with the tokenizer files (data.tokenizer_path, else model.weights_path) and its
  // field; empty: none. A directory without tokenizer.json gives no tokenizer files.
  std::string tokenizer_dir;
  std::string tokenizer_field;
  // Added to tokenizer_config.json when the tokenizer has no chat template of its own (a chat
  // fine-tune: the template of the format the model was trained on); empty: none.
  std::string chat_template;
};

// The tokenizer files copied where the base had them, in this order (tokenizer.model: a
// SentencePiece model, kept for loaders that read it).
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
                                                  "chat_template.jinja", "tokenizer.model",       "added_tokens.json"};
// The end-of-turn tokens a derived generation_config.json stops at, where the tokenizer has them
// (LLaMA-3's end of a turn, of a message with a tool call, and of the text).
inline constexpr const char* kEndOfTurnTokens[] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"};

class HfModelFiles {
 public:
  // Nothing known: config.json from the architecture alone, no other file.
  HfModelFiles() = default;
  // Reads the base's config.json and generation_config.json and the tokenizer files. A file that is
  // not there is left out; one that is there and cannot be read, or is not valid JSON, is an error
  // naming the spec field and the file.
  static absl::StatusOr<HfModelFiles> Read(const HfModelSources& sources);

  // config.json for weights of `config` stored as `torch_dtype`: the base's fields as they were
  // (the architecture unchanged by training), the dtype set, bos_token_id and eos_token_id taken
  // from the tokenizer where the base had none.
  std::string ConfigJson(const spec::LlamaConfig& config, std::string_view torch_dtype) const;
  // generation_config.json: the base's as it was; without one, derived from the config's and the
  // tokenizer's BOS and EOS and the tokenizer's end-of-turn tokens; empty when nothing is known.
  const std::string& generation_config() const { return generation_config_; }
  // The files Write writes, config.json first.
  std::vector<std::string> names() const;
  // Writes them into `dir`, each fsynced (the caller fsyncs the directory).
  absl::Status Write(const std::string& dir, const spec::LlamaConfig& config, std::string_view torch_dtype) const;

 private:
  std::string base_config_;                                         // a JSON object's text, or empty
  std::string generation_config_;                                   // text, or empty
  std::vector<std::pair<std::string, std::string>> tokenizer_files_;  // name, contents
  std::optional<int64_t> bos_id_, eos_id_;                          // tokenizer_config.json's, as ids
};

}  // namespace ftd::engine
