#include "worker/engine/core/hf_model_files.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/data/tokenizer.h"
#include "worker/engine/core/fs_util.h"

namespace ftd::engine {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The file's contents; nullopt where it does not exist. Any other failure is an error naming `field`.
absl::StatusOr<std::optional<std::string>> ReadOptional(const fs::path& path, std::string_view field) {
  auto text = ReadRegularFile(path.string(), field);
  if (absl::IsNotFound(text.status())) return std::optional<std::string>();
  if (!text.ok()) return text.status();
  return std::optional<std::string>(*std::move(text));
}

absl::StatusOr<json> ParseObject(const std::string& text, const fs::path& path, std::string_view field) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    // Not the parser's message: it would quote the file, which may be one the caller may not read.
    return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", path.string(), " is not a JSON object"));
  }
  return j;
}

// A token's id by its tokenizer.json spelling: the added tokens first, then the BPE vocabulary.
std::optional<int64_t> TokenId(const json& tokenizer, const std::string& token) {
  if (auto it = tokenizer.find("added_tokens"); it != tokenizer.end() && it->is_array()) {
    for (const json& t : *it) {
      if (!t.is_object() || !t.contains("content") || !t.contains("id")) continue;
      const json &content = t["content"], &id = t["id"];
      if (content.is_string() && content.get_ref<const std::string&>() == token && id.is_number_integer()) {
        return id.get<int64_t>();
      }
    }
  }
  if (auto m = tokenizer.find("model"); m != tokenizer.end() && m->is_object()) {
    if (auto v = m->find("vocab"); v != m->end() && v->is_object()) {
      if (auto id = v->find(token); id != v->end() && id->is_number_integer()) return id->get<int64_t>();
    }
  }
  return std::nullopt;
}

// An id field of a config (an integer, or for eos_token_id also a list of them), as a list.
std::vector<int64_t> Ids(const json& config, const char* key) {
  std::vector<int64_t> out;
  auto it = config.find(key);
  if (it == config.end()) return out;
  if (it->is_number_integer()) out.push_back(it->get<int64_t>());
  if (it->is_array()) {
    for (const json& v : *it) {
      if (v.is_number_integer()) out.push_back(v.get<int64_t>());
    }
  }
  return out;
}

bool Missing(const json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

}  // namespace

absl::StatusOr<HfModelFiles> HfModelFiles::Read(const HfModelSources& src) {
  HfModelFiles f;
  json config = json::object();
  if (!src.config_path.empty()) {
    fs::path path(src.config_path);
    std::error_code ec;
    const bool dir = fs::is_directory(path, ec);
    if (dir) path /= "config.json";
    auto text = ReadRegularFile(path.string(), src.config_field);
    if (!text.ok()) return text.status();
    auto j = ParseObject(*text, path, src.config_field);
    if (!j.ok()) return j.status();
    config = *std::move(j);
    f.base_config_ = config.dump(2);
    const fs::path gen = (dir ? fs::path(src.config_path) : path.parent_path()) / "generation_config.json";
    auto g = ReadOptional(gen, src.config_field);
    if (!g.ok()) return g.status();
    if (g->has_value()) {
      if (auto parsed = ParseObject(**g, gen, src.config_field); !parsed.ok()) return parsed.status();
      f.generation_config_ = **g;
    }
  }

  json tokenizer, tokenizer_config;
  std::vector<int64_t> end_of_turn;
  if (!src.tokenizer_dir.empty()) {
    for (const char* name : kTokenizerFiles) {
      const fs::path path = fs::path(src.tokenizer_dir) / name;
      auto text = ReadOptional(path, src.tokenizer_field);
      if (!text.ok()) return text.status();
      if (!text->has_value()) continue;
      if (std::string_view(name).ends_with(".json")) {
        auto j = ParseObject(**text, path, src.tokenizer_field);
        if (!j.ok()) return j.status();
        if (std::string_view(name) == "tokenizer.json") tokenizer = *std::move(j);
        if (std::string_view(name) == "tokenizer_config.json") tokenizer_config = *std::move(j);
      }
      f.tokenizer_files_.emplace_back(name, **std::move(text));
    }
  }
  auto has = [&](std::string_view name) {
    return std::any_of(f.tokenizer_files_.begin(), f.tokenizer_files_.end(),
                       [&](const auto& file) { return file.first == name; });
  };
  if (has("tokenizer.json")) {
    for (const auto& [key, out] : {std::pair{"bos_token", &f.bos_id_}, std::pair{"eos_token", &f.eos_id_}}) {
      if (!tokenizer_config.is_object() || !tokenizer_config.contains(key)) continue;
      if (auto content = data::ConfigTokenContent(tokenizer_config[key])) *out = TokenId(tokenizer, *content);
    }
    for (const char* token : kEndOfTurnTokens) {
      if (auto id = TokenId(tokenizer, token)) end_of_turn.push_back(*id);
    }
    // A chat fine-tune of a tokenizer without a template: the template of what it was trained on,
    // so that apply_chat_template renders prompts as training did.
    const bool templated = has("chat_template.jinja") ||
                           (tokenizer_config.is_object() && !Missing(tokenizer_config, "chat_template"));
    if (!src.chat_template.empty() && !templated) {
      if (!tokenizer_config.is_object()) tokenizer_config = json::object();
      tokenizer_config["chat_template"] = src.chat_template;
      const std::string text = tokenizer_config.dump(2);
      auto it = std::find_if(f.tokenizer_files_.begin(), f.tokenizer_files_.end(),
                             [](const auto& file) { return file.first == "tokenizer_config.json"; });
      if (it != f.tokenizer_files_.end()) {
        it->second = text;
      } else {
        f.tokenizer_files_.emplace_back("tokenizer_config.json", text);
      }
    }
  }

  if (f.generation_config_.empty()) {
    // As transformers derives one from a model's config, with the tokenizer's EOS and end-of-turn
    // tokens added: generation then stops at the end of the assistant's turn.
    std::vector<int64_t> bos = Ids(config, "bos_token_id");
    if (bos.empty() && f.bos_id_) bos.push_back(*f.bos_id_);
    std::vector<int64_t> eos = Ids(config, "eos_token_id");
    if (f.eos_id_) eos.push_back(*f.eos_id_);
    eos.insert(eos.end(), end_of_turn.begin(), end_of_turn.end());
    std::vector<int64_t> unique;
    for (int64_t id : eos) {
      if (std::find(unique.begin(), unique.end(), id) == unique.end()) unique.push_back(id);
    }
    json g = json::object();
    if (!bos.empty()) g["bos_token_id"] = bos.front();
    if (!unique.empty()) g["eos_token_id"] = unique.size() == 1 ? json(unique.front()) : json(unique);
    if (auto pad = Ids(config, "pad_token_id"); !pad.empty()) g["pad_token_id"] = pad.front();
    if (!g.empty()) f.generation_config_ = g.dump(2);
  }
  return f;
}

std::string HfModelFiles::ConfigJson(const spec::LlamaConfig& config, std::string_view torch_dtype) const {
  json j = json::parse(base_config_.empty() ? config.ToJson() : base_config_);
  j["torch_dtype"] = torch_dtype;
  j["dtype"] = torch_dtype;
  if (Missing(j, "architectures")) j["architectures"] = {"LlamaForCausalLM"};
  if (Missing(j, "model_type")) j["model_type"] = "llama";
  if (Missing(j, "bos_token_id") && bos_id_) j["bos_token_id"] = *bos_id_;
  if (Missing(j, "eos_token_id") && eos_id_) j["eos_token_id"] = *eos_id_;
  return j.dump(2);
}

std::vector<std::string> HfModelFiles::names() const {
  std::vector<std::string> out = {"config.json"};
  if (!generation_config_.empty()) out.emplace_back("generation_config.json");
  for (const auto& [name, text] : tokenizer_files_) out.push_back(name);
  return out;
}

absl::Status HfModelFiles::Write(const std::string& dir, const spec::LlamaConfig& config,
                                 std::string_view torch_dtype) const {
  const fs::path d(dir);
  if (auto s = WriteFileSynced((d / "config.json").string(), ConfigJson(config, torch_dtype)); !s.ok()) return s;
  if (!generation_config_.empty()) {
    if (auto s = WriteFileSynced((d / "generation_config.json").string(), generation_config_); !s.ok()) return s;
  }
  for (const auto& [name, text] : tokenizer_files_) {
    if (auto s = WriteFileSynced((d / name).string(), text); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ftd::engine
