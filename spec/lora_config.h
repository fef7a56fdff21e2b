// LoRA fine-tuning (spec.lora): low-rank adapters on frozen projections, in PEFT's conventions so
// the result loads with peft.PeftModel.from_pretrained (docs/job-spec.md, "LoRA"). No LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ftd::spec {

// The projections an adapter can sit on, in a layer's order.
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr size_t kNumLoraTargets = 7;
// As spelled in spec.lora.target_modules.
inline constexpr std::array<const char*, kNumLoraTargets> kLoraTargetNames = {"q", "k", "v", "o",
                                                                                    "gate", "up", "down"};
// HF's module names (PEFT's target_modules) and the module that holds each.
inline constexpr std::array<const char*, kNumLoraTargets> kLoraModuleNames = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
inline constexpr std::array<const char*, kNumLoraTargets> kLoraModuleParents = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp"};

inline constexpr int32_t kMaxLoraRank = 4096;

struct LoraConfig {
  bool enabled = false;  // spec.lora is present
  int32_t rank = 8;      // r
  std::optional<double> alpha;  // lora_alpha; unset: rank (scale 1)
  double dropout = 0;           // on the adapter's input, training only; [0, 1)
  // Short names (kLoraTargetNames); the spec also takes HF's ("q_proj"). Default: all seven.
  std::vector<std::string> target_modules = {"q", "k", "v", "o", "gate", "up", "down"};
  // "kaiming_uniform": A ~ kaiming_uniform_(a=sqrt(5)) (U(-1/sqrt(in), 1/sqrt(in))), B = 0, PEFT's
  // default; "gaussian": A ~ N(0, 1/rank), B = 0, PEFT's init_lora_weights="gaussian".
  std::string init = "kaiming_uniform";
  bool use_rslora = false;     // scale alpha / sqrt(rank) instead of alpha / rank
  std::string dtype = "fp32";  // adapters and their AdamW state: "fp32" | "bf16"
  bool merge = false;          // also write the merged full model with the final checkpoint
  std::string adapter_path;    // start from this PEFT adapter directory instead of the init

  // The adapter's output multiplier: alpha / rank, or alpha / sqrt(rank) with use_rslora.
  double Scale() const;
  double Alpha() const { return alpha.value_or(static_cast<double>(rank)); }
  // Which targets are on, by LoraTarget (call after Validate).
  std::array<bool, kNumLoraTargets> Targets() const;
  // Checks every field; messages name the field (spec.lora.*) and the fix.
  absl::Status Validate() const;
};

// The LoraTarget a spec name ("q" or "q_proj") stands for.
std::optional<LoraTarget> ParseLoraTarget(std::string_view name);

// A PEFT adapter's adapter_config.json (`text`, read from `path`) against what ftd trains: a LoRA of
// one rank and one alpha on whole projections. INVALID_ARGUMENT naming the setting for anything that
// would make the adapter compute something else than ftd would train and write back: per-module
// rank_pattern and alpha_pattern, alora_invocation_tokens (activated LoRA), DoRA, biases, some layers
// only, modules trained beside the adapters, an init that rewrote the base weights (PiSSA, OLoRA,
// CorDA, LoftQ, LoRA-GA), and a setting this list does not know whose value is not empty, false or
// null. Values are not quoted (the file may be another user's). Metadata (task_type, revision,
// peft_version, ...) and init-only settings of an adapter already trained are ignored.
absl::Status CheckPeftAdapterSettings(const std::string& text, const std::string& path);

// CheckPeftAdapterSettings, then the adapter against spec.lora `cfg`, which must match it: r,
// lora_alpha, use_rslora and target_modules. The message names both and the field to change.
absl::Status CheckPeftAdapter(const std::string& text, const std::string& path, const LoraConfig& cfg);

}  // namespace ftd::spec
