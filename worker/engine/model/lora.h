// LoRA adapters on the model's frozen projections, in PEFT's conventions (names, init, scale,
// adapter_config.json), so what ftd writes loads with peft.PeftModel.from_pretrained and what PEFT
// writes starts an ftd run. Internal to the engine (LibTorch).
//
//   y = x W^T + scale * dropout(x) A^T B^T      A: [rank, in], B: [out, rank], in the adapter dtype
//
// The adapter path runs in the adapters' dtype (x is cast to it) and the sum in the promoted dtype,
// cast back to the base's, as PEFT's Linear.forward does.
#pragma once

#include <torch/torch.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/core/progress.h"
#include "worker/engine/spec_types.h"

namespace ftd::engine {

struct LoraAdapter {
  torch::Tensor a, b;  // undefined: this projection has no adapter
  bool on() const { return a.defined(); }
};

// One layer's adapters, by LoraTarget.
using LayerAdapters = std::array<LoraAdapter, spec::kNumLoraTargets>;

// The frozen projection x W^T plus the adapter's term (eager LibTorch ops; autograd reaches A and
// B only). `train`: dropout applies.
torch::Tensor LoraLinear(const torch::Tensor& x, const torch::Tensor& w, const LoraAdapter& ad, double scale,
                         double dropout, bool train);

// The `fused` lora op: projections of one input x [..., in] (q/k/v, or gate/up) with frozen weights
// ws[i] [out_i, in] and adapters ads[i] (all on; dropout 0). One GEMM computes every adapter's
// x A^T (A concatenated), each base GEMM's output receives its adapter's term in the GEMM's epilogue
// (addmm, beta 1, alpha scale), in x's dtype with fp32 accumulation (fp32 adapters on a bf16 base:
// their operands as bf16 hi + lo pairs, fp32 rank-sized results); backward likewise: one GEMM
// for the adapters' input gradients, dA from one GEMM, no weight gradient for ws. Saves x and the
// [N, sum of ranks] adapter activations only (eager saves a copy of x in the adapters' dtype per
// adapter). Returns y_i [..., out_i].
std::vector<torch::Tensor> LoraLinearGroup(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                                           const std::vector<const LoraAdapter*>& ads, double scale);

// PEFT's name of an adapter matrix: base_model.model.model.layers.<i>.<self_attn|mlp>.<q_proj>.lora_<A|B>.weight
std::string LoraTensorName(int64_t layer, spec::LoraTarget t, bool is_b);

// Draws a new adapter for a projection [out, in] as PEFT does (spec.lora.init): A from `gen` (CPU,
// fp32, then moved), B zero.
LoraAdapter NewLoraAdapter(int64_t in, int64_t out, const spec::LoraConfig& cfg, torch::Generator& gen,
                           torch::Device device);

// adapter_config.json in PEFT's LoraConfig format.
std::string PeftAdapterConfigJson(const spec::LoraConfig& cfg, const std::string& base_model);

// Writes dir/adapter_model.safetensors (the named adapters) and dir/adapter_config.json;
// `progress`, when given, counts the adapters' bytes.
absl::Status SavePeftAdapter(const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& named,
                             const spec::LoraConfig& cfg, const std::string& base_model,
                             ProgressMeter* progress = nullptr);
// Reads a PEFT adapter directory into the named adapters (same names and shapes, dtype converted).
// Its adapter_config.json must agree with `cfg` (rank, alpha, rslora, target modules); a tensor
// missing, extra, or of another shape is refused naming it.
absl::Status LoadPeftAdapter(const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& named,
                             const spec::LoraConfig& cfg);

// The LoraConfig a PEFT adapter directory describes (rank, alpha, rslora, dropout, target
// modules; adapter_path set to `dir`), for tools that load an adapter without a spec.
absl::StatusOr<spec::LoraConfig> LoraConfigFromPeft(const std::string& dir);

}  // namespace ftd::engine
