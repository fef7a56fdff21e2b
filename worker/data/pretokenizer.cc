#include "worker/data/pretokenizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/data/strings.h"

namespace ftd::data {
namespace {

using json = nlohmann::json;

absl::Status Bad(const std::string& where, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", Av(problem)));
}

size_t Utf8Len(char lead) {
  const auto b = static_cast<uint8_t>(lead);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

}  // namespace

absl::Status PreTokenizer::Load(const json& node) {
  stages_.clear();
  if (node.is_null()) {
    return Bad("pre_tokenizer", "is null; a byte-level BPE tokenizer needs a ByteLevel pre-tokenizer");
  }
  bool byte_level = false;
  if (auto st = Add(node, "pre_tokenizer", &byte_level); !st.ok()) return st;
  if (!byte_level) return Bad("pre_tokenizer", "has no ByteLevel step; ftd reads byte-level BPE tokenizers only");
  return absl::OkStatus();
}

absl::Status PreTokenizer::Add(const json& node, const std::string& where, bool* byte_level_seen) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    return Bad(where, "expected an object with a \"type\"");
  }
  const std::string type = node["type"];
  if (*byte_level_seen) {
    return Bad(where, absl::StrCat("a ", type, " step after ByteLevel is not supported (ByteLevel must come last)"));
  }
  if (type == "Sequence") {
    if (!node.contains("pretokenizers") || !node["pretokenizers"].is_array()) {
      return Bad(where, "Sequence without a \"pretokenizers\" array");
    }
    const json& list = node["pretokenizers"];
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto st = Add(list[i], absl::StrCat(where, ".pretokenizers[", i, "]"), byte_level_seen); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    Stage s;
    s.kind = Stage::Kind::kSplit;
    const json& pattern = node.value("pattern", json());
    absl::StatusOr<std::unique_ptr<SplitRegex>> re;
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      re = SplitRegex::FromOniguruma(pattern["Regex"].get<std::string>());
      s.description = absl::StrCat("Split(Regex ", pattern["Regex"].get<std::string>());
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      re = SplitRegex::Literal(pattern["String"].get<std::string>());
      s.description = absl::StrCat("Split(String ", pattern["String"].dump());
    } else {
      return Bad(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    if (!re.ok()) return Bad(where + ".pattern", Sv(re.status().message()));
    s.re = *std::move(re);
    const std::string behavior = node.value("behavior", std::string());
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    bool found = false;
    for (const auto& [name, b] : kBehaviors) {
      if (behavior == name) {
        s.behavior = b;
        found = true;
      }
    }
    if (!found) {
      return Bad(where + ".behavior",
                 absl::StrCat("\"", behavior, "\" is not one of Removed, Isolated, MergedWithPrevious, "
                                              "MergedWithNext, Contiguous"));
    }
    if (node.contains("invert") && !node["invert"].is_boolean()) return Bad(where + ".invert", "expected a boolean");
    s.invert = node.value("invert", false);
    absl::StrAppend(&s.description, ", ", behavior, s.invert ? ", invert" : "", ")");
    stages_.push_back(std::move(s));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    *byte_level_seen = true;
    const bool prefix = node.value("add_prefix_space", true);  // HF's defaults
    const bool use_regex = node.value("use_regex", true);
    if (prefix) {
      Stage s;
      s.kind = Stage::Kind::kPrefixSpace;
      s.description = "ByteLevel prefix space";
      stages_.push_back(std::move(s));
    }
    if (use_regex) {
      auto re = SplitRegex::FromOniguruma(kGpt2Pattern);
      if (!re.ok()) return re.status();
      Stage s;
      s.kind = Stage::Kind::kSplit;
      s.re = *std::move(re);
      s.description = "ByteLevel GPT-2 split";
      stages_.push_back(std::move(s));
    }
    return absl::OkStatus();
  }
  return Bad(where, absl::StrCat("pre-tokenizer type \"", type,
                                 "\" is not supported (ftd reads Sequence, Split and ByteLevel)"));
}

std::string PreTokenizer::Describe() const {
  std::vector<std::string> parts;
  for (const Stage& s : stages_) parts.push_back(s.description);
  parts.push_back("ByteLevel bytes");
  return absl::StrJoin(parts, " -> ");
}

absl::Status PreTokenizer::Run(std::string_view text, Scratch* sc,
                               absl::FunctionRef<void(std::string_view)> emit) const {
  if (sc->pieces.size() < stages_.size()) {
    sc->pieces.resize(stages_.size());
    sc->buffers.resize(stages_.size());
  }
  if (text.empty()) return absl::OkStatus();
  return RunStage(0, text, sc, emit);
}

absl::Status PreTokenizer::RunStage(size_t k, std::string_view piece, Scratch* sc,
                                    absl::FunctionRef<void(std::string_view)> emit) const {
  if (k == stages_.size()) {
    emit(piece);
    return absl::OkStatus();
  }
  const Stage& stage = stages_[k];
  if (stage.kind == Stage::Kind::kPrefixSpace) {
    if (piece[0] == ' ') return RunStage(k + 1, piece, sc, emit);
    std::string& buf = sc->buffers[k];
    buf.assign(1, ' ');
    buf.append(piece);
    return RunStage(k + 1, buf, sc, emit);
  }
  // Matches as Oniguruma's find_iter gives them (an empty match right after the previous match is
  // skipped by one character), with the gaps between them: HF's Pattern::find_matches.
  const bool stream = stage.behavior == SplitBehavior::kIsolated && !stage.invert;
  auto& list = sc->pieces[k];
  list.clear();
  size_t prev = 0, last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= piece.size()) {
    size_t b, e;
    auto found = stage.re->Find(piece, last_end, &sc->match, &b, &e);
    if (!found.ok()) return found.status();
    if (!*found) break;
    if (b == e && have_last && last_match_end == e) {
      last_end += last_end < piece.size() ? Utf8Len(piece[last_end]) : 1;
      continue;
    }
    last_end = e;
    last_match_end = e;
    have_last = true;
    if (stream) {
      if (prev != b) {
        if (auto st = RunStage(k + 1, piece.substr(prev, b - prev), sc, emit); !st.ok()) return st;
      }
      if (b != e) {
        if (auto st = RunStage(k + 1, piece.substr(b, e - b), sc, emit); !st.ok()) return st;
      }
    } else {
      if (prev != b) list.push_back({prev, b, stage.invert});
      list.push_back({b, e, !stage.invert});
    }
    prev = e;
  }
  if (stream) {
    if (prev != piece.size()) return RunStage(k + 1, piece.substr(prev), sc, emit);
    return absl::OkStatus();
  }
  if (prev != piece.size()) list.push_back({prev, piece.size(), stage.invert});

  // HF's NormalizedString::split: the delimiter behaviour, in place. Each entry's is_match now
  // means "remove".
  using P = Scratch::Piece;
  std::vector<P> out;
  out.reserve(list.size());
  switch (stage.behavior) {
    case SplitBehavior::kIsolated:
      for (const P& p : list) out.push_back({p.begin, p.end, false});
      break;
    case SplitBehavior::kRemoved:
      out = list;
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const P& p : list) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back({p.begin, p.end, false});
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const P& p : list) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back({p.begin, p.end, false});
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = list.rbegin(); it != list.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  for (const P& p : out) {
    if (p.is_match || p.begin == p.end) continue;
    if (auto st = RunStage(k + 1, piece.substr(p.begin, p.end - p.begin), sc, emit); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace ftd::data
