#include "worker/data/tokenizer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/data/parallel_encode.h"
#include "worker/data/strings.h"
#include "worker/data/utf8.h"

namespace ftd::data {
namespace {

using json = nlohmann::json;

absl::Status Bad(std::string_view where, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(Av(where), ": ", Av(problem)));
}

// The file's bytes, opened beneath the job's roots when the worker is confined.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  auto f = MappedFile::Open(path);
  if (!f.ok()) return f.status();
  return std::string(f->contents());
}

// HF's ByteLevel decoder for one token: its characters' bytes when all are in the ByteLevel
// alphabet, else the token's own UTF-8.
std::string ByteLevelDecode(std::string_view token) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    size_t len;
    const int b = ByteLevelByte(DecodeUtf8At(token, i, &len));
    if (b < 0) return std::string(token);
    bytes.push_back(static_cast<char>(b));
    i += len;
  }
  return bytes;
}

}  // namespace

std::optional<std::string> ConfigTokenContent(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::LoadDir(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  auto text = ReadFile(path);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat(text.status().message(),
                                            " (a model directory's HF tokenizer; --tokenizer names the directory)"));
  }
  if (!text.ok()) return text.status();
  std::string config;
  auto c = ReadFile(dir + "/tokenizer_config.json");  // optional
  if (c.ok()) {
    config = *std::move(c);
  } else if (!absl::IsNotFound(c.status())) {
    return c.status();
  }
  return FromJson(*text, config, path);
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                                    std::string_view config_json,
                                                                    std::string_view source) {
  const json root = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return Bad(source, "not a JSON object");
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  if (root.contains("version") && root["version"] != "1.0") {
    return Bad(source, absl::StrCat("version ", root["version"].dump(), " is not the known tokenizer.json version 1.0"));
  }
  for (const char* name : {"truncation", "padding"}) {
    if (root.contains(name) && !root[name].is_null()) {
      return Bad(source, absl::StrCat(name, " is set; ftd encodes whole texts (the dataset options cut and pad), "
                                            "set it to null"));
    }
  }
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    return Bad(source, absl::StrCat("normalizer ", root["normalizer"].value("type", std::string("?")),
                                    " is not supported (byte-level BPE tokenizers such as LLaMA-3's and GPT-2's "
                                    "have none)"));
  }
  if (!root.contains("model")) return Bad(source, "has no model");
  if (auto st = t->model_.Load(root["model"]); !st.ok()) return Bad(source, Sv(st.message()));
  if (auto st = t->added_.Load(root.value("added_tokens", json::array()), t->model_); !st.ok()) {
    return Bad(source, Sv(st.message()));
  }
  if (auto st = t->pre_.Load(root.value("pre_tokenizer", json())); !st.ok()) return Bad(source, Sv(st.message()));
  if (auto st = t->LoadPostProcessor(root.value("post_processor", json()), "post_processor"); !st.ok()) {
    return Bad(source, Sv(st.message()));
  }
  // The decoder: ByteLevel, alone or as the only step of a Sequence.
  const json decoder = root.value("decoder", json());
  const bool byte_level_decoder =
      (decoder.is_object() && decoder.value("type", "") == "ByteLevel") ||
      (decoder.is_object() && decoder.value("type", "") == "Sequence" && decoder.contains("decoders") &&
       decoder["decoders"].is_array() && decoder["decoders"].size() == 1 &&
       decoder["decoders"][0].value("type", "") == "ByteLevel");
  if (!byte_level_decoder) {
    return Bad(source, absl::StrCat("decoder ", decoder.dump(),
                                    " is not supported; byte-level BPE decodes with the ByteLevel decoder"));
  }

  t->vocab_size_ = std::max(t->model_.id_limit(), t->added_.id_limit());
  t->decoded_.assign(t->vocab_size_, std::string());
  t->known_.assign(t->vocab_size_, false);
  t->special_.assign(t->vocab_size_, false);
  for (uint32_t id = 0; id < t->vocab_size_; ++id) {
    std::optional<std::string> token = t->IdToToken(id);
    if (!token) continue;
    t->known_[id] = true;
    t->decoded_[id] = ByteLevelDecode(*token);
    t->special_[id] = t->added_.IsSpecial(*token);
  }
  for (uint32_t id : t->prefix_) {
    if (id >= t->vocab_size_ || !t->known_[id]) return Bad(source, absl::StrCat("post_processor uses unknown id ", id));
  }
  for (uint32_t id : t->suffix_) {
    if (id >= t->vocab_size_ || !t->known_[id]) return Bad(source, absl::StrCat("post_processor uses unknown id ", id));
  }
  if (!config_json.empty()) {
    if (auto st = t->LoadConfig(config_json, source); !st.ok()) return st;
  }
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

absl::Status Tokenizer::LoadPostProcessor(const json& node, const std::string& where) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = node.is_object() ? node.value("type", std::string()) : std::string();
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    if (!node.contains("processors") || !node["processors"].is_array()) {
      return Bad(where, "Sequence without a \"processors\" array");
    }
    for (size_t i = 0; i < node["processors"].size(); ++i) {
      if (auto st = LoadPostProcessor(node["processors"][i], absl::StrCat(where, ".processors[", i, "]")); !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return Bad(where, absl::StrCat("post-processor type \"", type,
                                   "\" is not supported (ftd reads TemplateProcessing, ByteLevel and Sequence)"));
  }
  if (!prefix_.empty() || !suffix_.empty()) return Bad(where, "a second TemplateProcessing is not supported");
  const json& single = node.value("single", json());
  const json& specials = node.value("special_tokens", json::object());
  if (!single.is_array()) return Bad(where + ".single", "expected an array");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    const std::string at = absl::StrCat(where, ".single[", i, "]");
    if (piece.is_object() && piece.contains("Sequence")) {
      const std::string id = piece["Sequence"].value("id", std::string());
      if (id != "A") return Bad(at, absl::StrCat("sequence \"", id, "\" in a single-sequence template (expected A)"));
      if (seen_sequence) return Bad(at, "the sequence appears twice");
      seen_sequence = true;
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].value("id", std::string());
      if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
        return Bad(at, absl::StrCat("special token \"", name, "\" is not in special_tokens with its ids"));
      }
      for (const json& v : specials[name]["ids"]) {
        if (!v.is_number_unsigned()) return Bad(at, absl::StrCat("special token \"", name, "\" has a bad id"));
        (seen_sequence ? suffix_ : prefix_).push_back(v.get<uint32_t>());
      }
    } else {
      return Bad(at, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_sequence) return Bad(where + ".single", "has no $A sequence");
  return absl::OkStatus();
}

absl::Status Tokenizer::LoadConfig(std::string_view config_json, std::string_view source) {
  const std::string where = absl::StrCat(Av(source.substr(0, source.rfind('/') + 1)), "tokenizer_config.json");
  const json cfg = json::parse(config_json, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) return Bad(where, "not a JSON object");
  for (auto [name, out] : {std::pair{"bos_token", &bos_id_}, std::pair{"eos_token", &eos_id_}}) {
    if (!cfg.contains(name) || cfg[name].is_null()) continue;
    const auto content = ConfigTokenContent(cfg[name]);
    if (!content) return Bad(where, absl::StrCat(name, ": expected a string or an object with \"content\""));
    const auto id = TokenToId(*content);
    if (!id) return Bad(where, absl::StrCat(name, " \"", *content, "\" is not a token of tokenizer.json"));
    *out = *id;
  }
  return absl::OkStatus();
}

std::optional<uint32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto id = added_.IdOf(token)) return id;
  if (const uint32_t* id = model_.FindText(token)) return *id;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::IdToToken(uint32_t id) const {
  if (const AddedToken* t = added_.ById(id)) return t->content;
  if (model_.HasId(id)) return model_.TextOf(id);
  return std::nullopt;
}

absl::StatusOr<std::vector<uint32_t>> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  Encoder e(*this);
  std::vector<uint32_t> ids;
  if (auto st = e.Encode(text, &ids, options); !st.ok()) return st;
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (id >= vocab_size_ || !known_[id]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cannot decode id %d at position %d: the tokenizer has no such id (vocabulary size %d)", id,
                          i, vocab_size_));
    }
    if (skip_special_tokens && special_[id]) continue;
    bytes += decoded_[id];
  }
  if (IsValidUtf8(bytes)) return bytes;
  std::string text;
  AppendRepairedUtf8(bytes, &text);
  return text;
}

Encoder::Encoder(const Tokenizer& tokenizer) : tok_(tokenizer) {}

void Encoder::ClearCache() {
  cache_.clear();
  cache_ids_.clear();
  if (arena_.size() > 1) arena_.resize(1);  // the first block is reused
  arena_used_ = 0;
}

void Encoder::EncodePiece(std::string_view piece, std::vector<uint32_t>* out) {
  if (piece.size() > kMaxCachedPiece) {
    tok_.model_.EncodePiece(piece, out);
    return;
  }
  if (auto it = cache_.find(piece); it != cache_.end()) {
    const uint32_t* ids = cache_ids_.data() + it->second.offset;
    out->insert(out->end(), ids, ids + it->second.len);
    return;
  }
  const size_t first = out->size();
  tok_.model_.EncodePiece(piece, out);
  if (cache_.size() >= kMaxCacheEntries) ClearCache();
  if (arena_.empty() || arena_used_ + piece.size() > kArenaBlock) {
    arena_.push_back(std::make_unique<char[]>(kArenaBlock));
    arena_used_ = 0;
  }
  char* key = arena_.back().get() + arena_used_;
  std::memcpy(key, piece.data(), piece.size());
  arena_used_ += piece.size();
  const Entry entry{static_cast<uint32_t>(cache_ids_.size()), static_cast<uint32_t>(out->size() - first)};
  cache_ids_.insert(cache_ids_.end(), out->begin() + static_cast<ptrdiff_t>(first), out->end());
  cache_.emplace(std::string_view(key, piece.size()), entry);
}

absl::Status Encoder::Encode(std::string_view text, std::vector<uint32_t>* out, const EncodeOptions& options) {
  if (!IsValidUtf8(text)) {
    repaired_.clear();
    AppendRepairedUtf8(text, &repaired_);
    text = repaired_;
  }
  if (options.add_special_tokens) out->insert(out->end(), tok_.prefix_.begin(), tok_.prefix_.end());
  auto emit = [this, out](std::string_view piece) { EncodePiece(piece, out); };
  if (tok_.added_.empty()) {
    if (auto st = tok_.pre_.Run(text, &pre_scratch_, emit); !st.ok()) return st;
  } else {
    segments_.clear();
    if (auto st = tok_.added_.Split(text, &pre_scratch_.match, &segments_); !st.ok()) return st;
    for (const Segment& s : segments_) {
      if (s.id >= 0) {
        out->push_back(static_cast<uint32_t>(s.id));
      } else if (auto st = tok_.pre_.Run(text.substr(s.begin, s.end - s.begin), &pre_scratch_, emit); !st.ok()) {
        return st;
      }
    }
  }
  if (options.add_special_tokens) out->insert(out->end(), tok_.suffix_.begin(), tok_.suffix_.end());
  return absl::OkStatus();
}

absl::Status Encoder::Pieces(std::string_view text, std::vector<std::string>* out) {
  if (!IsValidUtf8(text)) {
    repaired_.clear();
    AppendRepairedUtf8(text, &repaired_);
    text = repaired_;
  }
  auto emit = [out](std::string_view piece) { out->emplace_back(piece); };
  segments_.clear();
  if (auto st = tok_.added_.Split(text, &pre_scratch_.match, &segments_); !st.ok()) return st;
  for (const Segment& s : segments_) {
    const std::string_view sub = text.substr(s.begin, s.end - s.begin);
    if (s.id >= 0) {
      out->emplace_back(sub);
    } else if (auto st = tok_.pre_.Run(sub, &pre_scratch_, emit); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace ftd::data
