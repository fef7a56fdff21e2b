#include "spec/lora_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

}  // namespace ftd::spec
