#include "spec/lora_config.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace ftd::spec {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view rule, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat("spec.lora.", field, " ", rule, " (got ", got, ")"));
}

}  // namespace

std::optional<LoraTarget> ParseLoraTarget(std::string_view name) {
  for (size_t i = 0; i < kNumLoraTargets; ++i) {
    if (name == kLoraTargetNames[i] || name == kLoraModuleNames[i]) return static_cast<LoraTarget>(i);
  }
  return std::nullopt;
}

double LoraConfig::Scale() const {
  const double r = static_cast<double>(rank);
  return Alpha() / (use_rslora ? std::sqrt(r) : r);
}

std::array<bool, kNumLoraTargets> LoraConfig::Targets() const {
  std::array<bool, kNumLoraTargets> on{};
  for (const auto& m : target_modules) {
    if (auto t = ParseLoraTarget(m)) on[static_cast<size_t>(*t)] = true;
  }
  return on;
}

absl::Status LoraConfig::Validate() const {
  if (!enabled) return absl::OkStatus();
  if (rank < 1 || rank > kMaxLoraRank) {
    return Invalid("rank", absl::StrCat("must be in [1, ", kMaxLoraRank, "]"), absl::StrCat(rank));
  }
  if (alpha.has_value() && !(*alpha > 0 && std::isfinite(*alpha))) {
    return Invalid("alpha", "must be a finite number > 0 (unset: the rank, a scale of 1)", absl::StrCat(*alpha));
  }
  if (!(dropout >= 0 && dropout < 1)) {
    return Invalid("dropout", "must be in [0, 1)", absl::StrCat(dropout));
  }
  if (target_modules.empty()) {
    return Invalid("target_modules", absl::StrCat("needs at least one of: ", absl::StrJoin(kLoraTargetNames, ", ")),
                   "[]");
  }
  std::array<bool, kNumLoraTargets> seen{};
  for (const auto& m : target_modules) {
    auto t = ParseLoraTarget(m);
    if (!t) {
      return Invalid("target_modules",
                     absl::StrCat("takes only ", absl::StrJoin(kLoraTargetNames, ", "), " (or HF's names: ",
                                  absl::StrJoin(kLoraModuleNames, ", "), ")"),
                     absl::StrCat("\"", m.substr(0, 100), "\""));
    }
    if (seen[static_cast<size_t>(*t)]) {
      return Invalid("target_modules", "names each module once", absl::StrCat("\"", m.substr(0, 100), "\" twice"));
    }
    seen[static_cast<size_t>(*t)] = true;
  }
  if (init != "kaiming_uniform" && init != "gaussian") {
    return Invalid("init",
                   "must be \"kaiming_uniform\" (A as nn.Linear's default, B zero: PEFT's default) or \"gaussian\" "
                   "(A ~ N(0, 1/rank), B zero)",
                   absl::StrCat("\"", init.substr(0, 100), "\""));
  }
  if (dtype != "fp32" && dtype != "bf16") {
    return Invalid("dtype", "must be \"fp32\" or \"bf16\" (the adapters' and their AdamW state's dtype)",
                   absl::StrCat("\"", dtype.substr(0, 100), "\""));
  }
  return absl::OkStatus();
}

namespace {

using json = nlohmann::json;

// How ftd treats each key of PEFT's LoraConfig (peft 0.21).
enum class Peft {
  kRead,     // read and honoured (r, lora_alpha, use_rslora, target_modules, ...)
  kIgnore,   // metadata, or a setting that only mattered when the adapter was created
  kNeutral,  // changes the math unless empty, false or null: refused otherwise
};

struct PeftKey {
  const char* key;
  Peft how;
  const char* what;  // for kNeutral: what the setting does, in the refusal
};

constexpr PeftKey kPeftKeys[] = {
    {"peft_type", Peft::kRead, ""},
    {"r", Peft::kRead, ""},
    {"lora_alpha", Peft::kRead, ""},
    {"lora_dropout", Peft::kRead, ""},
    {"target_modules", Peft::kRead, ""},
    {"use_rslora", Peft::kRead, ""},
    {"init_lora_weights", Peft::kRead, ""},
    {"bias", Peft::kRead, ""},
    {"task_type", Peft::kIgnore, ""},
    {"auto_mapping", Peft::kIgnore, ""},
    {"peft_version", Peft::kIgnore, ""},
    {"base_model_name_or_path", Peft::kIgnore, ""},
    {"revision", Peft::kIgnore, ""},
    {"inference_mode", Peft::kIgnore, ""},
    {"runtime_config", Peft::kIgnore, ""},
    {"megatron_core", Peft::kIgnore, ""},      // a module name, used only with megatron_config
    {"qalora_group_size", Peft::kIgnore, ""},  // used only with use_qalora
    {"layers_pattern", Peft::kIgnore, ""},     // used only with layers_to_transform
    // The init's own settings: the adapter is already trained (init_lora_weights says whether the
    // init also rewrote the base weights).
    {"loftq_config", Peft::kIgnore, ""},
    {"eva_config", Peft::kIgnore, ""},
    {"corda_config", Peft::kIgnore, ""},
    {"lora_ga_config", Peft::kIgnore, ""},
    {"rank_pattern", Peft::kNeutral, "a rank per module"},
    {"alpha_pattern", Peft::kNeutral, "a lora_alpha per module"},
    {"alora_invocation_tokens", Peft::kNeutral, "activated LoRA (the adapters act only after these tokens)"},
    {"use_dora", Peft::kNeutral, "DoRA (weight-decomposed adapters)"},
    {"lora_bias", Peft::kNeutral, "a trained bias on lora_B"},
    {"fan_in_fan_out", Peft::kNeutral, "transposed (Conv1D) weights"},
    {"modules_to_save", Peft::kNeutral, "modules trained in full beside the adapters"},
    {"layers_to_transform", Peft::kNeutral, "adapters on some layers only"},
    {"exclude_modules", Peft::kNeutral, "modules left without adapters"},
    {"layer_replication", Peft::kNeutral, "replicated layers"},
    {"trainable_token_indices", Peft::kNeutral, "trained embedding rows"},
    {"target_parameters", Peft::kNeutral, "adapters on parameters rather than modules"},
    {"megatron_config", Peft::kNeutral, "Megatron parallel layers"},
    {"use_qalora", Peft::kNeutral, "QA-LoRA (pooled adapter inputs)"},
    {"velora_config", Peft::kNeutral, "VeLoRA (compressed activations)"},
    {"monteclora_config", Peft::kNeutral, "MonteCLoRA (sampled adapters)"},
    {"use_bdlora", Peft::kNeutral, "block-diagonal LoRA"},
    {"arrow_config", Peft::kNeutral, "Arrow routing between adapters"},
    {"kasa_config", Peft::kNeutral, "KaSA (SVD-adapted adapters)"},
    {"ensure_weight_tying", Peft::kNeutral, "adapters tied across the embeddings"},
};

bool IsNeutral(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
         (v.is_array() && v.empty()) || (v.is_string() && v.get_ref<const std::string&>().empty());
}

absl::Status NotImplemented(const std::string& path, const std::string& key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.lora.adapter_path: ", path, " sets ", key, " (", what,
      "), which ftd does not implement: training it here would compute something else and write it back without "
      "it; use an adapter without ", key, ", or merge it into the base model first"));
}

// The parsed config, or why it is not one.
absl::StatusOr<json> ParsePeftConfig(const std::string& text, const std::string& path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.lora.adapter_path: ", path, " is not a JSON object"));
  }
  return j;
}

absl::Status CheckSettings(const json& j, const std::string& path) {
  if (j.value("peft_type", std::string()) != "LORA") {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.lora.adapter_path: ", path, ": peft_type is not \"LORA\" (ftd trains LoRA adapters only)"));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const PeftKey* known = nullptr;
    for (const PeftKey& k : kPeftKeys) {
      if (key == k.key) known = &k;
    }
    if (known == nullptr) {
      if (IsNeutral(*it)) continue;
      return NotImplemented(path, key, "a setting ftd does not know, which may change what the adapter computes");
    }
    if (known->how == Peft::kNeutral && !IsNeutral(*it)) return NotImplemented(path, key, known->what);
  }
  if (const auto b = j.find("bias"); b != j.end() && !(b->is_string() && *b == "none")) {
    return NotImplemented(path, "bias", "trained biases of the adapted modules");
  }
  if (const auto init = j.find("init_lora_weights"); init != j.end() && init->is_string()) {
    // These inits subtract the adapter's start from the base weights, so the adapter is meant for a
    // base that is no longer the model's own.
    const std::string& v = init->get_ref<const std::string&>();
    for (const char* rewrites : {"pissa", "olora", "corda", "loftq", "lora_ga"}) {
      if (absl::StartsWith(v, rewrites)) {
        return NotImplemented(path, "init_lora_weights",
                              "an init that rewrote the base model's weights, which ftd's base does not have");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPeftAdapterSettings(const std::string& text, const std::string& path) {
  auto j = ParsePeftConfig(text, path);
  if (!j.ok()) return j.status();
  return CheckSettings(*j, path);
}

absl::Status CheckPeftAdapter(const std::string& text, const std::string& path, const LoraConfig& cfg) {
  auto parsed = ParsePeftConfig(text, path);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  if (auto st = CheckSettings(j, path); !st.ok()) return st;
  const auto disagree = [&](const char* key, const std::string& theirs, const std::string& ours, const char* field) {
    return absl::InvalidArgumentError(absl::StrCat("spec.lora.adapter_path: ", path, ": ", key, " is ", theirs,
                                                   " but spec.lora.", field, " gives ", ours,
                                                   " (make the spec match the adapter)"));
  };
  const auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.lora.adapter_path: ", path, ": r is missing or not a whole number"));
  }
  if (r->get<int64_t>() != cfg.rank) return disagree("r", r->dump(), absl::StrCat(cfg.rank), "rank");
  const auto a = j.find("lora_alpha");
  const double alpha = a != j.end() && a->is_number() ? a->get<double>() : 8.0;  // PEFT's default
  if (std::abs(alpha - cfg.Alpha()) > 1e-9 * std::max(1.0, std::abs(alpha))) {
    return disagree("lora_alpha", a != j.end() ? a->dump() : "8 (PEFT's default)", absl::StrCat(cfg.Alpha()), "alpha");
  }
  const bool rslora = j.value("use_rslora", false);
  if (rslora != cfg.use_rslora) {
    return disagree("use_rslora", rslora ? "true" : "false", cfg.use_rslora ? "true" : "false", "use_rslora");
  }
  const auto tm = j.find("target_modules");
  if (tm == j.end() || !tm->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.lora.adapter_path: ", path,
                                                   ": target_modules must be a list of module names"));
  }
  std::set<std::string> theirs, ours;
  for (const auto& m : *tm) {
    if (!m.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("spec.lora.adapter_path: ", path,
                                                     ": target_modules must be a list of module names"));
    }
    theirs.insert(m.get<std::string>());
  }
  const auto on = cfg.Targets();
  for (size_t i = 0; i < on.size(); ++i) {
    if (on[i]) ours.insert(kLoraModuleNames[i]);
  }
  if (theirs != ours) {
    return disagree("target_modules", absl::StrCat("[", absl::StrJoin(theirs, ", "), "]"),
                    absl::StrCat("[", absl::StrJoin(ours, ", "), "]"), "target_modules");
  }
  return absl::OkStatus();
}

}  // namespace ftd::spec
