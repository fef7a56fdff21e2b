#include "worker/engine/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/engine/fs_util.h"
#include "worker/engine/safetensors.h"
#include "worker/engine/torch_util.h"

namespace ftd::engine {
namespace fs = std::filesystem;
using nlohmann::json;

torch::Tensor LoraLinear(const torch::Tensor& x, const torch::Tensor& w, const LoraAdapter& ad, double scale,
                         double dropout, bool train) {
  auto y = torch::linear(x, w);
  if (!ad.on()) return y;
  auto xa = x.to(ad.a.scalar_type());
  if (dropout > 0 && train) xa = torch::dropout(xa, dropout, /*train=*/true);
  auto delta = torch::linear(torch::linear(xa, ad.a), ad.b) * scale;
  return (y + delta).to(y.scalar_type());
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Mixed precision (a bf16 base, fp32 adapters): the adapters' small GEMMs take fp32 operands as a
// bf16 pair hi + lo (hi = bf16(v), lo = bf16(v - hi): about 16 mantissa bits) and write fp32, so the
// rank-sized activations and the adapters' gradients keep what PEFT's fp32 path keeps, while x and
// the base GEMMs stay bf16. These GEMMs are [N, rank]- or [rank, in]-sized: a few percent of a
// layer's base GEMMs.
struct Split {
  torch::Tensor hi, lo;  // lo undefined: hi is exact (no mixed precision)
};

Split SplitTo(const torch::Tensor& v, torch::ScalarType dt, bool mixed) {
  Split s;
  s.hi = v.to(dt).contiguous();
  if (mixed) s.lo = (v - s.hi.to(v.scalar_type())).to(dt).contiguous();
  return s;
}

// a b (a: [m, k] in the base dtype) in fp32: hi and lo products accumulated; without mixed
// precision a plain product in the operands' dtype.
torch::Tensor MmSplit(const torch::Tensor& a, const Split& b, bool b_transposed) {
  auto bh = b_transposed ? b.hi.t() : b.hi;
  if (!b.lo.defined()) return torch::mm(a, bh);
  auto out = at::mm(a, bh, torch::kFloat);
  return out.add_(at::mm(a, b_transposed ? b.lo.t() : b.lo, torch::kFloat));
}
torch::Tensor MmSplitLeft(const Split& a, const torch::Tensor& b) {  // a^T b with a [k, m]
  if (!a.lo.defined()) return torch::mm(a.hi.t(), b);
  auto out = at::mm(a.hi.t(), b, torch::kFloat);
  return out.add_(at::mm(a.lo.t(), b, torch::kFloat));
}

// Inputs (flattened by LibTorch): x, then n weights, n A, n B; outputs: n projections.
struct LoraGroupFn : public torch::autograd::Function<LoraGroupFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList ws, at::TensorList as,
                               at::TensorList bs, double scale) {
    const int64_t n = static_cast<int64_t>(ws.size()), in = x.size(-1);
    auto x2 = x.reshape({-1, in});
    const auto dt = x.scalar_type();
    const auto adt = as[0].scalar_type();
    // fp32 adapters on a bf16 base, on a GPU (the CPU has no bf16 x bf16 -> fp32 GEMM; there the
    // adapters are cast to the base's dtype).
    const bool mixed = adt == torch::kFloat && dt != torch::kFloat && x.is_cuda();
    const Split a = SplitTo(torch::cat(std::vector<torch::Tensor>(as.begin(), as.end()), 0), dt, mixed);  // [R, in]
    auto u = MmSplit(x2, a, /*b_transposed=*/true);  // [N, R], fp32 when mixed
    const Split us = SplitTo(u, dt, mixed);
    variable_list out;
    auto shape = x.sizes().vec();
    int64_t off = 0;
    std::vector<int64_t> ranks;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = as[i].size(0);
      auto y = torch::mm(x2, ws[i].t());
      // The adapter's term in the GEMM's epilogue. Mixed: u B^T ~ u_hi B_hi^T + u_lo B_hi^T + u_hi B_lo^T
      // as one GEMM over the concatenated rank (3r): one pass over y, as for r.
      const Split bsplit = SplitTo(bs[i], dt, mixed);
      auto ui = us.hi.narrow(1, off, r);
      if (mixed) {
        auto u3 = torch::cat({ui, us.lo.narrow(1, off, r), ui}, 1);
        auto b3 = torch::cat({bsplit.hi, bsplit.hi, bsplit.lo}, 1);
        y.addmm_(u3, b3.t(), /*beta=*/1, /*alpha=*/scale);
      } else {
        y.addmm_(ui, bsplit.hi.t(), /*beta=*/1, /*alpha=*/scale);
      }
      shape.back() = ws[i].size(0);
      out.push_back(y.view(shape));
      ranks.push_back(r);
      off += r;
    }
    variable_list saved = {x2, u, a.hi, a.lo};
    for (int64_t i = 0; i < n; ++i) saved.push_back(ws[i]);
    for (int64_t i = 0; i < n; ++i) saved.push_back(bs[i]);
    ctx->save_for_backward(saved);
    ctx->saved_data["n"] = n;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["mixed"] = mixed;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["ranks"] = ranks;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const int64_t n = ctx->saved_data["n"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const bool mixed = ctx->saved_data["mixed"].toBool();
    const auto ranks = ctx->saved_data["ranks"].toIntVector();
    const auto& x2 = saved[0];
    const auto& u = saved[1];
    const Split a{saved[2], saved[3]};
    const auto dt = x2.scalar_type();
    auto w = [&](int64_t i) -> const torch::Tensor& { return saved[4 + i]; };
    auto b = [&](int64_t i) -> const torch::Tensor& { return saved[4 + n + i]; };
    std::vector<torch::Tensor> dy;
    for (int64_t i = 0; i < n; ++i) dy.push_back(grads[i].reshape({x2.size(0), -1}));
    // The adapters' gradient at their rank-sized bottleneck: g_i = scale * dy_i B_i.
    std::vector<torch::Tensor> g;
    for (int64_t i = 0; i < n; ++i) g.push_back(MmSplit(dy[i], SplitTo(b(i), dt, mixed), /*b_transposed=*/false));
    auto g_cat = torch::cat(g, 1).mul_(scale);  // [N, R]
    const Split gs = SplitTo(g_cat, dt, mixed);
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = torch::mm(dy[0], w(0));
      for (int64_t i = 1; i < n; ++i) dx.addmm_(dy[i], w(i));
      if (mixed) {  // G A ~ G_hi A_hi + G_lo A_hi + G_hi A_lo, one GEMM over 3R
        dx.addmm_(torch::cat({gs.hi, gs.lo, gs.hi}, 1), torch::cat({a.hi, a.hi, a.lo}, 0));
      } else {
        dx.addmm_(gs.hi, a.hi);
      }
      dx = dx.view(ctx->saved_data["x_shape"].toIntVector());
    }
    auto da_cat = MmSplitLeft(gs, x2);  // [R, in]
    variable_list out = {dx};
    for (int64_t i = 0; i < n; ++i) out.emplace_back();  // frozen weights
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
      out.push_back(da_cat.narrow(0, off, ranks[i]).to(b(i).scalar_type()));
      off += ranks[i];
    }
    off = 0;
    for (int64_t i = 0; i < n; ++i) {
      const Split ui = SplitTo(u.narrow(1, off, ranks[i]), dt, mixed);
      auto db = mixed ? MmSplit(dy[i].t(), Split{ui.hi, ui.lo}, false) : torch::mm(dy[i].t(), ui.hi);
      out.push_back(db.mul_(scale).to(b(i).scalar_type()));
      off += ranks[i];
    }
    out.emplace_back();  // scale
    return out;
  }
};

}  // namespace

std::vector<torch::Tensor> LoraLinearGroup(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                                           const std::vector<const LoraAdapter*>& ads, double scale) {
  std::vector<torch::Tensor> as, bs;
  for (const auto* ad : ads) {
    as.push_back(ad->a);
    bs.push_back(ad->b);
  }
  return LoraGroupFn::apply(x, at::TensorList(ws), at::TensorList(as), at::TensorList(bs), scale);
}

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
  try {
    json j = json::parse(*text);
    if (j.value("peft_type", std::string()) != "LORA") {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": peft_type is not \"LORA\""));
    }
    auto disagree = [&](const char* key, const std::string& theirs, const std::string& ours, const char* field) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", key, " is ", theirs, " but spec.lora.", field,
                                                     " gives ", ours, " (make the spec match the adapter)"));
    };
    if (j.at("r").get<int64_t>() != cfg.rank) {
      return disagree("r", j.at("r").dump(), absl::StrCat(cfg.rank), "rank");
    }
    const double alpha = j.value("lora_alpha", 8.0);
    if (std::abs(alpha - cfg.Alpha()) > 1e-9 * std::max(1.0, std::abs(alpha))) {
      return disagree("lora_alpha", j.at("lora_alpha").dump(), absl::StrCat(cfg.Alpha()), "alpha");
    }
    const bool rslora = j.value("use_rslora", false);
    if (rslora != cfg.use_rslora) {
      return disagree("use_rslora", rslora ? "true" : "false", cfg.use_rslora ? "true" : "false", "use_rslora");
    }
    if (j.value("use_dora", false)) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": DoRA adapters (use_dora) are not supported"));
    }
    std::set<std::string> theirs, ours;
    const auto& tm = j.at("target_modules");
    if (!tm.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": target_modules must be a list of module names (got ", tm.dump(), ")"));
    }
    for (const auto& m : tm) theirs.insert(m.get<std::string>());
    for (const auto& m : ModuleNames(cfg)) ours.insert(m);
    if (theirs != ours) {
      return disagree("target_modules", tm.dump(), absl::StrJoin(ours, ", "), "target_modules");
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", e.what()));
  }

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
