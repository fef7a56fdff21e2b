// The LLaMA model's parameters (model.h): built from a config (HF names, seeded initialisation),
// loaded from and written to HF safetensors (and config.json), with LoRA adapters added, saved and
// loaded in PEFT's format, and written merged into the base weights.
#include "worker/engine/model/model.h"

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "worker/engine/core/safetensors.h"
#include "worker/engine/torch_util.h"

namespace ftd::engine {

absl::StatusOr<LlamaConfig> ReadLlamaConfig(const std::string& path, std::string_view field) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  auto text = ReadRegularFile(p.string(), field);
  if (!text.ok()) return text.status();
  auto c = spec::ParseLlamaConfig(*text);
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat(std::string(field), ": ", p.string(), ": ", c.status().message()));
  }
  return c;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const LlamaConfig& c, torch::Device device,
                                                                torch::ScalarType dtype, uint64_t seed) {
  if (auto s = c.Validate(); !s.ok()) return s;
  std::unique_ptr<LlamaModel> m(new LlamaModel(c, device, dtype));
  torch::NoGradGuard no_grad;
  // Drawn directly on the device, in the model's dtype, from the device's default generator seeded
  // with `seed`: deterministic for a given seed and device kind.
  torch::manual_seed(seed);
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  const double std = c.initializer_range;
  auto normal = [&](std::vector<int64_t> shape) { return torch::empty(shape, opts).normal_(0.0, std); };
  auto ones = [&](int64_t n) { return torch::ones({n}, opts); };
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  m->Register("model.embed_tokens.weight", normal({c.vocab_size, h}));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    m->Register(p + "self_attn.q_proj.weight", normal({q, h}));
    m->Register(p + "self_attn.k_proj.weight", normal({kv, h}));
    m->Register(p + "self_attn.v_proj.weight", normal({kv, h}));
    m->Register(p + "self_attn.o_proj.weight", normal({h, q}));
    m->Register(p + "mlp.gate_proj.weight", normal({c.intermediate_size, h}));
    m->Register(p + "mlp.up_proj.weight", normal({c.intermediate_size, h}));
    m->Register(p + "mlp.down_proj.weight", normal({h, c.intermediate_size}));
    m->Register(p + "input_layernorm.weight", ones(h));
    m->Register(p + "post_attention_layernorm.weight", ones(h));
  }
  m->Register("model.norm.weight", ones(h));
  if (!c.tie_word_embeddings) m->Register("lm_head.weight", normal({c.vocab_size, h}));
  for (auto& [name, t] : m->params_) t.set_requires_grad(true);
  // Bind the named tensors to the structure used by the forward pass.
  auto get = [&](const std::string& name) {
    for (auto& [n, t] : m->params_) {
      if (n == name) return t;
    }
    return torch::Tensor();
  };
  m->embed_ = get("model.embed_tokens.weight");
  m->final_norm_ = get("model.norm.weight");
  m->lm_head_ = c.tie_word_embeddings ? m->embed_ : get("lm_head.weight");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    m->layers_.push_back(Layer{get(p + "input_layernorm.weight"), get(p + "self_attn.q_proj.weight"),
                               get(p + "self_attn.k_proj.weight"), get(p + "self_attn.v_proj.weight"),
                               get(p + "self_attn.o_proj.weight"), get(p + "post_attention_layernorm.weight"),
                               get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight"),
                               get(p + "mlp.down_proj.weight"), {}});
  }
  m->inv_freq_ = RopeInvFreq(c).to(device);
  return m;
}

void LlamaModel::Register(const std::string& name, torch::Tensor t) { params_.emplace_back(name, std::move(t)); }

absl::Status LlamaModel::LoadWeights(const std::string& dir, ProgressMeter* progress) {
  auto set = SafetensorsSet::OpenDir(dir);
  if (!set.ok()) return set.status();
  torch::NoGradGuard no_grad;
  std::vector<std::pair<torch::Tensor*, std::pair<const SafetensorsFile*, const TensorInfo*>>> todo;
  for (auto& [name, param] : params_) {
    auto found = set->Find(name);
    if (!found.ok()) return absl::NotFoundError(absl::StrCat(dir, ": ", found.status().message()));
    const auto& [file, info] = *found;
    if (!TorchDType(info->dtype).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": tensor \"", name, "\" has dtype ",
                                                     DTypeName(info->dtype), "; weights must be F32, F16 or BF16"));
    }
    if (info->shape != param.sizes().vec()) {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": tensor \"", name, "\" has shape ",
                                                     ShapeString(info->shape), ", the config needs ",
                                                     ShapeString(param.sizes().vec())));
    }
    todo.push_back({&param, *found});
  }
  if (progress != nullptr) {
    for (const auto& [param, found] : todo) progress->AddTotal(found.second->end - found.second->begin);
  }
  // Rows at a time, about 64 MiB of the file each: reading a mapped file is what takes the time,
  // and progress is reported between pieces.
  constexpr int64_t kPiece = 64 << 20;
  for (const auto& [param, found] : todo) {
    const auto& [file, info] = found;
    auto src = torch::from_blob(const_cast<std::byte*>(file->data(*info)), info->shape,
                                torch::TensorOptions().dtype(*TorchDType(info->dtype)));
    const int64_t bytes = static_cast<int64_t>(info->end - info->begin);
    const int64_t rows = src.dim() == 0 ? 1 : src.size(0);
    const int64_t step = src.dim() == 0 ? 1 : std::max<int64_t>(1, rows * kPiece / std::max<int64_t>(bytes, 1));
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t n = std::min(step, rows - r);
      if (src.dim() == 0) {
        param->copy_(src);
      } else {
        param->narrow(0, r, n).copy_(src.narrow(0, r, n));
      }
      if (progress != nullptr) progress->Add(static_cast<uint64_t>(bytes / rows * n));
    }
  }
  weights_dir_ = dir;
  return absl::OkStatus();
}

absl::Status LlamaModel::SaveWeights(const std::string& dir, ProgressMeter* progress) const {
  return WriteWeights(dir, /*merged=*/false, progress);
}

absl::Status LlamaModel::SaveMerged(const std::string& dir, ProgressMeter* progress) const {
  if (!lora_.enabled) return absl::FailedPreconditionError("SaveMerged needs LoRA adapters");
  return WriteWeights(dir, /*merged=*/true, progress);
}

const torch::Tensor& LlamaModel::Layer::Weight(spec::LoraTarget t) const {
  switch (t) {
    case spec::LoraTarget::kQ: return q;
    case spec::LoraTarget::kK: return k;
    case spec::LoraTarget::kV: return v;
    case spec::LoraTarget::kO: return o;
    case spec::LoraTarget::kGate: return gate;
    case spec::LoraTarget::kUp: return up;
    case spec::LoraTarget::kDown: return down;
  }
  return q;
}

absl::Status LlamaModel::EnableLora(const spec::LoraConfig& lora, uint64_t seed) {
  if (!lora.enabled) return absl::OkStatus();
  if (auto s = lora.Validate(); !s.ok()) return s;
  lora_ = lora;
  for (auto& [name, t] : params_) t.set_requires_grad(false);
  const auto on = lora.Targets();
  // Drawn on the CPU from their own generator: the same adapters for a seed on any device.
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (size_t t = 0; t < on.size(); ++t) {
      if (!on[t]) continue;
      const auto target = static_cast<spec::LoraTarget>(t);
      const auto& w = layers_[i].Weight(target);
      auto& ad = layers_[i].lora[t];
      ad = NewLoraAdapter(w.size(1), w.size(0), lora, gen, device_);
      adapters_.emplace_back(LoraTensorName(static_cast<int64_t>(i), target, false), ad.a);
      adapters_.emplace_back(LoraTensorName(static_cast<int64_t>(i), target, true), ad.b);
    }
  }
  if (!lora.adapter_path.empty()) {
    if (auto s = LoadPeftAdapter(lora.adapter_path, adapters_, lora_); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("spec.lora.adapter_path: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::SaveAdapters(const std::string& dir, ProgressMeter* progress) const {
  return SavePeftAdapter(dir, adapters_, lora_, weights_dir_, progress);
}

absl::Status LlamaModel::LoadAdapters(const std::string& dir) { return LoadPeftAdapter(dir, adapters_, lora_); }

absl::Status LlamaModel::WriteWeights(const std::string& dir, bool merged, ProgressMeter* progress) const {
  // With `merged`, each adapted projection is written as W + scale B A, one tensor at a time.
  std::map<const void*, const LoraAdapter*> adapter_of;  // a base weight's data -> its adapter
  if (merged) {
    for (const auto& L : layers_) {
      for (size_t t = 0; t < L.lora.size(); ++t) {
        if (L.lora[t].on()) adapter_of[L.Weight(static_cast<spec::LoraTarget>(t)).data_ptr()] = &L.lora[t];
      }
    }
  }
  torch::NoGradGuard no_grad;
  const double scale = lora_.Scale();
  auto produce = [&](size_t i) {
    const torch::Tensor& t = params_[i].second;
    auto it = adapter_of.find(t.data_ptr());
    if (it == adapter_of.end()) return t;
    const LoraAdapter& ad = *it->second;
    auto w = t.to(torch::kFloat) + scale * torch::mm(ad.b.to(torch::kFloat), ad.a.to(torch::kFloat));
    return w.to(t.scalar_type());
  };
  if (auto s = WriteTensors((std::filesystem::path(dir) / "model.safetensors").string(), params_, {{"format", "pt"}},
                            progress, produce);
      !s.ok()) {
    return s;
  }
  LlamaConfig c = config_;
  c.torch_dtype = dtype_ == torch::kBFloat16 ? "bfloat16" : dtype_ == torch::kHalf ? "float16" : "float32";
  return hf_files_.Write(dir, c, c.torch_dtype);
}

}  // namespace ftd::engine
