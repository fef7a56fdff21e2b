#include "spec/llama_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ftd::spec {
namespace {

using nlohmann::json;

absl::Status Bad(absl::string_view field, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", field, " ", rule));
}

template <typename T>
absl::Status Read(const json& j, const char* key, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? Bad(key, "is required") : absl::OkStatus();
  }
  try {
    *out = it->get<T>();
  } catch (const json::exception& e) {
    return Bad(key, absl::StrCat("has the wrong type: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status ReadRope(const json& r, RopeScaling* out, double* theta) {
  std::string type;
  if (r.contains("rope_type")) {
    type = r["rope_type"].get<std::string>();
  } else if (r.contains("type")) {
    type = r["type"].get<std::string>();
  }
  if (theta != nullptr && r.contains("rope_theta")) *theta = r["rope_theta"].get<double>();
  if (type.empty() || type == "default") {
    out->type.clear();
    return absl::OkStatus();
  }
  if (type != "llama3") {
    return Bad("rope_scaling.rope_type", absl::StrCat("\"", type, "\" is not supported (use llama3 or none)"));
  }
  out->type = type;
  absl::Status s;
  if (!(s = Read(r, "factor", &out->factor, true)).ok()) return s;
  if (!(s = Read(r, "low_freq_factor", &out->low_freq_factor, true)).ok()) return s;
  if (!(s = Read(r, "high_freq_factor", &out->high_freq_factor, true)).ok()) return s;
  return Read(r, "original_max_position_embeddings", &out->original_max_position_embeddings, true);
}

}  // namespace

absl::Status LlamaConfig::Validate() const {
  auto positive = [](const char* name, int64_t v) {
    return v >= 1 ? absl::OkStatus() : Bad(name, absl::StrCat("must be >= 1 (got ", v, ")"));
  };
  for (auto s : {positive("vocab_size", vocab_size), positive("hidden_size", hidden_size),
                 positive("intermediate_size", intermediate_size),
                 positive("num_hidden_layers", num_hidden_layers),
                 positive("num_attention_heads", num_attention_heads),
                 positive("num_key_value_heads", num_key_value_heads), positive("head_dim", head_dim)}) {
    if (!s.ok()) return s;
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return Bad("num_key_value_heads", absl::StrCat("must divide num_attention_heads (", num_attention_heads,
                                                  " % ", num_key_value_heads, " != 0)"));
  }
  if (head_dim % 2 != 0) return Bad("head_dim", absl::StrCat("must be even for RoPE (got ", head_dim, ")"));
  if (!(rms_norm_eps > 0)) return Bad("rms_norm_eps", "must be > 0");
  if (!(rope_theta > 0)) return Bad("rope_theta", "must be > 0");
  if (rope_scaling.type == "llama3") {
    if (!(rope_scaling.factor > 0)) return Bad("rope_scaling.factor", "must be > 0");
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
      return Bad("rope_scaling.high_freq_factor", "must be > low_freq_factor");
    }
    if (rope_scaling.original_max_position_embeddings < 1) {
      return Bad("rope_scaling.original_max_position_embeddings", "must be >= 1");
    }
  }
  return absl::OkStatus();
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  const int64_t per_layer = hidden_size * (q + 2 * kv) + q * hidden_size +
                            3 * hidden_size * intermediate_size + 2 * hidden_size;
  const int64_t embed = vocab_size * hidden_size;
  return embed * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * per_layer + hidden_size;
}

std::string LlamaConfig::ToJson() const {
  json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"tie_word_embeddings", tie_word_embeddings},
      {"max_position_embeddings", max_position_embeddings},
      {"initializer_range", initializer_range},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"torch_dtype", torch_dtype},
      {"dtype", torch_dtype},
  };
  if (rope_scaling.type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", rope_scaling.type},
                         {"factor", rope_scaling.factor},
                         {"low_freq_factor", rope_scaling.low_freq_factor},
                         {"high_freq_factor", rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  }
  return j.dump(2);
}

absl::StatusOr<LlamaConfig> ParseLlamaConfig(const std::string& json_text) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception&) {
    // Not the parser's message: it quotes the bytes it read, and the file may be one the caller
    // may not read.
    return absl::InvalidArgumentError("config.json is not valid JSON");
  }
  if (!j.is_object()) return absl::InvalidArgumentError("config.json must hold a JSON object");
  std::string model_type;
  if (j.contains("model_type") && j["model_type"].is_string()) model_type = j["model_type"];
  if (!model_type.empty() && model_type != "llama") {
    return Bad("model_type", absl::StrCat("\"", model_type, "\" is not supported (use llama)"));
  }
  LlamaConfig c;
  absl::Status s;
  if (!(s = Read(j, "vocab_size", &c.vocab_size, true)).ok()) return s;
  if (!(s = Read(j, "hidden_size", &c.hidden_size, true)).ok()) return s;
  if (!(s = Read(j, "intermediate_size", &c.intermediate_size, true)).ok()) return s;
  if (!(s = Read(j, "num_hidden_layers", &c.num_hidden_layers, true)).ok()) return s;
  if (!(s = Read(j, "num_attention_heads", &c.num_attention_heads, true)).ok()) return s;
  c.num_key_value_heads = c.num_attention_heads;
  if (!(s = Read(j, "num_key_value_heads", &c.num_key_value_heads, false)).ok()) return s;
  if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  if (!(s = Read(j, "head_dim", &c.head_dim, false)).ok()) return s;
  if (!(s = Read(j, "rms_norm_eps", &c.rms_norm_eps, false)).ok()) return s;
  if (!(s = Read(j, "rope_theta", &c.rope_theta, false)).ok()) return s;
  if (!(s = Read(j, "tie_word_embeddings", &c.tie_word_embeddings, false)).ok()) return s;
  if (!(s = Read(j, "max_position_embeddings", &c.max_position_embeddings, false)).ok()) return s;
  if (!(s = Read(j, "initializer_range", &c.initializer_range, false)).ok()) return s;
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) c.torch_dtype = j["torch_dtype"];
  if (j.contains("dtype") && j["dtype"].is_string()) c.torch_dtype = j["dtype"];
  for (const char* key : {"hidden_act"}) {
    if (j.contains(key) && j[key] != "silu") return Bad(key, "must be \"silu\"");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (j.contains(key) && j[key].is_boolean() && j[key].get<bool>()) return Bad(key, "must be false");
  }
  try {
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
      if (!(s = ReadRope(j["rope_parameters"], &c.rope_scaling, &c.rope_theta)).ok()) return s;
    } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
      if (!(s = ReadRope(j["rope_scaling"], &c.rope_scaling, nullptr)).ok()) return s;
    }
  } catch (const json::exception& e) {
    return Bad("rope_scaling", absl::StrCat("is malformed: ", e.what()));
  }
  if (!(s = c.Validate()).ok()) return s;
  return c;
}

absl::Status CheckSequenceLength(const LlamaConfig& c, int64_t seq_len, const std::string& source) {
  if (seq_len <= c.max_position_embeddings) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.seq_len ", seq_len, " is above the model's max_position_embeddings ", c.max_position_embeddings, " (",
      source, "): it was trained on no position past that, and its RoPE (",
      c.rope_scaling.type.empty() ? "no scaling" : absl::StrCat(c.rope_scaling.type, " scaling"),
      ") does not extend it; lower spec.seq_len to at most ", c.max_position_embeddings,
      " (to train longer rows on purpose, raise max_position_embeddings in the model's config.json)"));
}

absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  std::ifstream in(p);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read model config ", p.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = ParseLlamaConfig(ss.str());
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(p.string(), ": ", c.status().message()));
  return c;
}

absl::StatusOr<LlamaConfig> PresetLlamaConfig(const std::string& name) {
  LlamaConfig c;
  if (name == "llama-3.1-8b") {
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 131072;
    c.initializer_range = 0.02;
    c.torch_dtype = "bfloat16";
    return c;
  }
  if (name == "tiny") {  // a small LLaMA (GQA, llama3 RoPE) that trains in seconds on a CPU
    c.vocab_size = 64;
    c.hidden_size = 128;
    c.intermediate_size = 352;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 256};
    c.max_position_embeddings = 2048;
    c.initializer_range = 0.02;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("spec.model.preset must be one of: llama-3.1-8b, tiny (got ", name, ")"));
}

}  // namespace ftd::spec
