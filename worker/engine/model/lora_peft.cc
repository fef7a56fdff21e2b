// LoRA adapters in PEFT's conventions (lora.h): the tensors' names, a new adapter initialised as
// PEFT does, and an adapter directory (adapter_model.safetensors and adapter_config.json) written,
// read back and its config mapped to spec.lora.
#include "worker/engine/model/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/engine/core/fs_util.h"
#include "worker/engine/core/safetensors.h"
#include "worker/engine/torch_util.h"

namespace ftd::engine {
namespace fs = std::filesystem;
using nlohmann::json;

std::string LoraTensorName(int64_t layer, spec::LoraTarget t, bool is_b) {
  const auto i = static_cast<size_t>(t);
  return absl::StrCat("base_model.model.model.layers.", layer, ".", spec::kLoraModuleParents[i], ".",
                      spec::kLoraModuleNames[i], is_b ? ".lora_B.weight" : ".lora_A.weight");
}

LoraAdapter NewLoraAdapter(int64_t in, int64_t out, const spec::LoraConfig& cfg, torch::Generator& gen,
                           torch::Device device) {
  torch::NoGradGuard no_grad;
  const auto dtype = cfg.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
  auto a = torch::empty({cfg.rank, in}, torch::kFloat);
  if (cfg.init == "gaussian") {
    a.normal_(0.0, 1.0 / cfg.rank, gen);
  } else {
    // nn.init.kaiming_uniform_(a=sqrt(5)) on [rank, in]: gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / in).
    const double bound = std::sqrt(2.0 / 6.0) * std::sqrt(3.0 / static_cast<double>(in));
    a.uniform_(-bound, bound, gen);
  }
  LoraAdapter ad;
  ad.a = a.to(device, dtype).set_requires_grad(true);
  ad.b = torch::zeros({out, cfg.rank}, torch::TensorOptions().dtype(dtype).device(device)).set_requires_grad(true);
  return ad;
}

namespace {

std::vector<std::string> ModuleNames(const spec::LoraConfig& cfg) {
  std::vector<std::string> names;
  const auto on = cfg.Targets();
  for (size_t i = 0; i < on.size(); ++i) {
    if (on[i]) names.emplace_back(spec::kLoraModuleNames[i]);
  }
  std::sort(names.begin(), names.end());
  return names;
}

json Number(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) return json(static_cast<int64_t>(v));
  return json(v);
}

}  // namespace

std::string PeftAdapterConfigJson(const spec::LoraConfig& cfg, const std::string& base_model) {
  json j = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", cfg.rank},
            {"lora_alpha", Number(cfg.Alpha())},
            {"lora_dropout", cfg.dropout},
            {"target_modules", ModuleNames(cfg)},
            {"bias", "none"},
            {"use_rslora", cfg.use_rslora},
            {"use_dora", false},
            {"lora_bias", false},
            {"fan_in_fan_out", false},
            {"init_lora_weights", cfg.init == "gaussian" ? json("gaussian") : json(true)},
            {"inference_mode", true},
            {"base_model_name_or_path", base_model.empty() ? json(nullptr) : json(base_model)},
            {"modules_to_save", nullptr},
            {"layers_to_transform", nullptr},
            {"layers_pattern", nullptr},
            {"rank_pattern", json::object()},
            {"alpha_pattern", json::object()},
            {"revision", nullptr}};
  return j.dump(2);
}

absl::Status SavePeftAdapter(const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& named,
                             const spec::LoraConfig& cfg, const std::string& base_model, ProgressMeter* progress) {
  if (auto s = WriteTensors((fs::path(dir) / "adapter_model.safetensors").string(), named, {{"format", "pt"}}, progress);
      !s.ok()) {
    return s;
  }
  return WriteFileSynced((fs::path(dir) / "adapter_config.json").string(), PeftAdapterConfigJson(cfg, base_model));
}

absl::Status LoadPeftAdapter(const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& named,
                             const spec::LoraConfig& cfg) {
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  auto text = ReadRegularFile(config_path, "");
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(config_path, " cannot be read (", text.status().message(),
                                            "): not a PEFT adapter directory"));
  }
  // The same check ftd makes at submit (spec/lora_config.h): settings ftd does not implement are
  // refused by name, and the adapter must be the one the spec describes.
  if (auto st = spec::CheckPeftAdapter(*text, config_path, cfg); !st.ok()) return st;

  const std::string weights = (fs::path(dir) / "adapter_model.safetensors").string();
  auto file = SafetensorsFile::Open(weights);
  if (!file.ok()) return file.status();
  std::set<std::string> expected;
  torch::NoGradGuard no_grad;
  for (const auto& [name, param] : named) {
    expected.insert(name);
    const TensorInfo* info = (*file)->Find(name);
    if (info == nullptr) return absl::NotFoundError(absl::StrCat(weights, ": tensor \"", name, "\" is missing"));
    auto st = TorchDType(info->dtype);
    if (!st.ok() || (*st != torch::kFloat && *st != torch::kBFloat16 && *st != torch::kHalf)) {
      return absl::InvalidArgumentError(absl::StrCat(weights, ": tensor \"", name, "\" has dtype ",
                                                     DTypeName(info->dtype), "; adapters must be F32, F16 or BF16"));
    }
    if (info->shape != param.sizes().vec()) {
      return absl::InvalidArgumentError(absl::StrCat(weights, ": tensor \"", name, "\" has shape ",
                                                     ShapeString(info->shape), ", the spec needs ",
                                                     ShapeString(param.sizes().vec())));
    }
    auto src = torch::from_blob(const_cast<std::byte*>((*file)->data(*info)), info->shape,
                                torch::TensorOptions().dtype(*st));
    param.copy_(src);
  }
  for (const auto& t : (*file)->tensors()) {
    if (expected.count(t.name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(weights, ": tensor \"", t.name,
                                                     "\" is not an adapter this spec trains (only LoRA A/B of the "
                                                     "target modules; no biases, embeddings or modules_to_save)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<spec::LoraConfig> LoraConfigFromPeft(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  auto text = ReadRegularFile(path, "");
  if (!text.ok()) return text.status();
  if (auto st = spec::CheckPeftAdapterSettings(*text, path); !st.ok()) return st;
  spec::LoraConfig c;
  c.enabled = true;
  c.adapter_path = dir;
  try {
    json j = json::parse(*text);
    c.rank = j.at("r").get<int32_t>();
    c.alpha = j.value("lora_alpha", 8.0);
    c.dropout = j.value("lora_dropout", 0.0);
    c.use_rslora = j.value("use_rslora", false);
    c.target_modules.clear();
    for (const auto& m : j.at("target_modules")) c.target_modules.push_back(m.get<std::string>());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  if (auto s = c.Validate(); !s.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  return c;
}

}  // namespace ftd::engine
