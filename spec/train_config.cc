#include "spec/train_config.h"

#include <algorithm>
#include <cmath>
#include <vector>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace ftd::spec {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view rule, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, " ", rule, " (got ", got, ")"));
}

// An integer field in [lo, hi]: "must be >= lo" below, "must be <= hi" above, with the note.
absl::Status IntInRange(absl::string_view field, int64_t v, int64_t lo, int64_t hi, absl::string_view note = "") {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return Invalid(field, absl::StrCat(v < lo ? absl::StrCat("must be >= ", lo) : absl::StrCat("must be <= ", hi), note),
                 absl::StrCat(v));
}

// A floating-point field in [lo, hi] (or (lo, hi] when lo_open); NaN and infinities are outside.
absl::Status RealInRange(absl::string_view field, double v, double lo, double hi, bool lo_open = false,
                         absl::string_view note = "") {
  if ((lo_open ? v > lo : v >= lo) && v <= hi) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be a finite number in ", lo_open ? "(" : "[", lo, ", ", hi, "]", note),
                 absl::StrCat(v));
}

}  // namespace

std::optional<KernelSet> ParseKernelSet(std::string_view name) {
  if (name == KernelSetName(KernelSet::kEager)) return KernelSet::kEager;
  if (name == KernelSetName(KernelSet::kFused)) return KernelSet::kFused;
  if (name == KernelSetName(KernelSet::kFp8)) return KernelSet::kFp8;
  return std::nullopt;
}

std::optional<ActivationCheckpointing> ParseActivationCheckpointing(std::string_view name) {
  for (size_t i = 0; i < kActivationCheckpointingNames.size(); ++i) {
    if (name == kActivationCheckpointingNames[i]) return static_cast<ActivationCheckpointing>(i);
  }
  return std::nullopt;
}

absl::Status TrainConfig::Validate() const {
  const int sources = !model.preset.empty() + !model.config_path.empty();
  if (sources > 1) {
    return Invalid("model", "takes either preset or config_path, not both",
                   absl::StrCat("preset=", model.preset, ", config_path=", model.config_path));
  }
  if (!model.preset.empty() && model.preset != "llama-3.1-8b" && model.preset != "tiny") {
    return Invalid("model.preset", "must be one of: llama-3.1-8b, tiny", model.preset);
  }
  if (data.token_dtype != "uint16" && data.token_dtype != "uint32") {
    return Invalid("data.token_dtype", "must be \"uint16\" or \"uint32\"", data.token_dtype);
  }
  absl::Status s;
  if (data.format != "tokens" && data.format != "text" && data.format != "prompt_completion" &&
      data.format != "chat") {
    return Invalid("data.format", "must be one of: tokens, text, prompt_completion, chat", data.format);
  }
  if (data.jsonl() && data.path.empty()) {
    return Invalid("data.path", absl::StrCat("must name a JSONL file for data.format \"", data.format, "\""), "\"\"");
  }
  if (data.jsonl() && data.tokenizer_path.empty() && model.weights_path.empty()) {
    return Invalid("data.tokenizer_path",
                   "must name a directory with tokenizer.json for a JSONL format (or set model.weights_path to a "
                   "model directory that has one)",
                   "\"\"");
  }
  for (const auto& [name, value] : {std::pair{"text_field", &data.text_field}, {"prompt_field", &data.prompt_field},
                                    {"completion_field", &data.completion_field},
                                    {"messages_field", &data.messages_field}, {"role_field", &data.role_field},
                                    {"content_field", &data.content_field}}) {
    if (value->empty()) return Invalid(absl::StrCat("data.", name), "must not be empty", "\"\"");
  }
  if (data.on_bad_line != "refuse" && data.on_bad_line != "skip") {
    return Invalid("data.on_bad_line", "must be \"refuse\" or \"skip\"", data.on_bad_line);
  }
  if (data.sequence != "pack" && data.sequence != "pad") {
    return Invalid("data.sequence", "must be \"pack\" or \"pad\"", data.sequence);
  }
  if (!(data.eval_fraction >= 0 && data.eval_fraction < 1)) {
    return Invalid("data.eval_fraction", "must be in [0, 1)", absl::StrCat(data.eval_fraction));
  }
  if (!data.eval_path.empty() && data.eval_fraction > 0) {
    return Invalid("data", "takes eval_path or eval_fraction, not both",
                   absl::StrCat("eval_path=", data.eval_path, ", eval_fraction=", data.eval_fraction));
  }
  if (!(s = IntInRange("data.eval_every_steps", data.eval_every_steps, 0, kMaxSteps, " (0: only at the end)")).ok()) {
    return s;
  }
  if (data.eval_every_steps > 0 && !data.has_eval()) {
    return Invalid("data.eval_every_steps", "needs held-out data: set data.eval_path or data.eval_fraction",
                   absl::StrCat(data.eval_every_steps));
  }
  if (!(optimizer.lr > 0 && std::isfinite(optimizer.lr))) {
    return Invalid("optimizer.lr", "must be a finite number > 0", absl::StrCat(optimizer.lr));
  }
  if (!(optimizer.beta1 >= 0 && optimizer.beta1 < 1)) {
    return Invalid("optimizer.beta1", "must be in [0, 1)", absl::StrCat(optimizer.beta1));
  }
  if (!(optimizer.beta2 >= 0 && optimizer.beta2 < 1)) {
    return Invalid("optimizer.beta2", "must be in [0, 1)", absl::StrCat(optimizer.beta2));
  }
  if (!(s = RealInRange("optimizer.eps", optimizer.eps, 0, kMaxEps, /*lo_open=*/true)).ok()) return s;
  if (!(s = RealInRange("optimizer.weight_decay", optimizer.weight_decay, 0, kMaxWeightDecay)).ok()) return s;
  if (!(s = RealInRange("optimizer.grad_clip", optimizer.grad_clip, 0, kMaxGradClip, false, " (0 disables clipping)"))
           .ok()) {
    return s;
  }
  if (optimizer.overlap && optimizer.grad_clip > 0) {
    return Invalid("optimizer.overlap",
                   "needs optimizer.grad_clip 0: global-norm clipping needs every gradient before the first layer "
                   "is updated; set optimizer.grad_clip 0, or optimizer.overlap false to clip",
                   absl::StrCat("grad_clip ", optimizer.grad_clip));
  }
  if (optimizer.overlap && gpus > 1) {
    return Invalid("optimizer.overlap",
                   "runs on one rank: with spec.gpus > 1 the gradient reduction is what runs inside backward; set "
                   "optimizer.overlap false or gpus 1",
                   absl::StrCat("gpus ", gpus));
  }
  if (optimizer.shard_grads && !optimizer.shard_state) {
    return Invalid("optimizer.shard_grads",
                   "needs optimizer.shard_state true: a rank keeps the gradients of the tensors whose AdamW state it "
                   "holds (ZeRO-2 shards the gradients as ZeRO-1 shards the state); set optimizer.shard_state true, "
                   "or optimizer.shard_grads false",
                   "shard_state false");
  }
  if (schedule.kind != "constant" && schedule.kind != "cosine") {
    return Invalid("schedule.kind", "must be \"constant\" or \"cosine\"", schedule.kind);
  }
  if (!(s = IntInRange("schedule.warmup_steps", schedule.warmup_steps, 0, kMaxSteps)).ok()) return s;
  if (!(schedule.min_lr_ratio >= 0 && schedule.min_lr_ratio <= 1)) {
    return Invalid("schedule.min_lr_ratio", "must be in [0, 1]", absl::StrCat(schedule.min_lr_ratio));
  }
  if (!(s = IntInRange("checkpoint.every_steps", checkpoint.every_steps, 0, kMaxSteps, " (0: only at the end)")).ok()) {
    return s;
  }
  if (!(s = IntInRange("checkpoint.keep_last", checkpoint.keep_last, 0, kMaxKeepLast, " (0: keep all)")).ok()) {
    return s;
  }
  if (!(s = IntInRange("steps", steps, 1, kMaxSteps)).ok()) return s;
  if (!(s = IntInRange("batch_size", batch_size, 1, kMaxBatchSize)).ok()) return s;
  if (!(s = IntInRange("seq_len", seq_len, 1, kMaxSeqLen)).ok()) return s;
  if (!(s = IntInRange("grad_accum_steps", grad_accum_steps, 1, kMaxGradAccumSteps)).ok()) return s;
  if (!(s = IntInRange("log_every", log_every, 1, kMaxSteps)).ok()) return s;
  if (!(s = IntInRange("gpus", gpus, 1, device == "cpu" ? kMaxCpuRanks : kMaxGpus,
                       device == "cpu" ? " (CPU ranks, joined through Gloo)" : " (GPUs of one host)"))
           .ok()) {
    return s;
  }
  if (gpus > 1 && absl::StartsWith(device, "cuda:")) {
    return Invalid("device", absl::StrCat("names one GPU, but spec.gpus asks for ", gpus,
                                          ": use \"auto\" or \"cuda\" (rank r runs on the job's r-th GPU)"),
                   device);
  }
  const bool device_ok = device == "auto" || device == "cpu" || device == "cuda" ||
                         (absl::StartsWith(device, "cuda:") && device.size() > 5 && device.size() <= 9 &&
                          device.find_first_not_of("0123456789", 5) == std::string::npos);
  if (!device_ok) {
    return Invalid("device", "must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"", device);
  }
  if (dtype != "auto" && dtype != "bf16" && dtype != "fp32") {
    return Invalid("dtype", "must be \"auto\", \"bf16\" or \"fp32\"", dtype);
  }
  if (fp32_master_weights && dtype == "fp32") {
    return Invalid("fp32_master_weights", "needs dtype bf16 (fp32 weights are their own master)",
                   "dtype=fp32");
  }
  if (kernel_set == KernelSet::kMixed) {
    return Invalid("kernel_set", "must be \"eager\", \"fused\" or \"fp8\" (a mixed run is one kernel set with "
                   "per-op overrides in spec.kernels)", "mixed");
  }
  for (const auto& [op, impl] : kernels) {
    if (std::none_of(kKernelOpNames.begin(), kKernelOpNames.end(), [&](const char* n) { return op == n; })) {
      return Invalid(absl::StrCat("kernels.", op), absl::StrCat("is not an op; the ops are: ", absl::StrJoin(kKernelOpNames, ", ")),
                     op);
    }
    if (impl == KernelSet::kMixed) return Invalid(absl::StrCat("kernels.", op), "must be \"eager\" or \"fused\"", "mixed");
    if (impl == KernelSet::kFp8 && op != kKernelOpNames[static_cast<size_t>(KernelOp::kMatmul)]) {
      return Invalid(absl::StrCat("kernels.", op), "must be \"eager\" or \"fused\" (fp8 applies to matmul only)",
                     "fp8");
    }
  }
  const KernelChoice chosen = Kernels();
  if (chosen[KernelOp::kMatmul]) {
    if (dtype == "fp32") {
      return Invalid("dtype", "must be \"bf16\" or \"auto\" with FP8 matmuls (kernel_set fp8 or kernels.matmul fp8)",
                     dtype);
    }
    if (lora.enabled) {
      return Invalid("kernels.matmul", "must not be fp8 in a LoRA job (FP8 matmuls train full weights only): use "
                     "kernel_set \"fused\"", "fp8");
    }
  }
  if (!(s = IntInRange("kernel_tuning.linear_cross_entropy_chunk_rows", kernel_tuning.linear_cross_entropy_chunk_rows,
                       0, kMaxLinearCrossEntropyChunkRows, " (0 or unset: 2048)"))
           .ok()) {
    return s;
  }
  if (kernel_tuning.cuda_graphs) {
    // What one static graph of forward+backward cannot hold.
    const char* conflict = device == "cpu"                                              ? "device \"cpu\""
                           : grad_accum_steps > 1                                       ? "grad_accum_steps > 1"
                           : activation_checkpointing != ActivationCheckpointing::kNone ? "activation_checkpointing"
                           : full_checkpoint_layers > 0                                 ? "full_checkpoint_layers"
                           : optimizer.overlap                                          ? "optimizer.overlap"
                           : gpus > 1                                                   ? "gpus > 1"
                           : chosen[KernelOp::kMatmul]                                  ? "FP8 matmuls"
                           : lora.enabled && lora.dropout > 0                           ? "lora.dropout > 0"
                                                                                        : nullptr;
    if (conflict != nullptr) {
      return Invalid("kernel_tuning.cuda_graphs",
                     "captures one static forward+backward on a CUDA device: it runs without gradient accumulation, "
                     "activation checkpointing, optimizer.overlap, several GPUs, FP8 matmuls or LoRA dropout; set it "
                     "false or drop the other",
                     conflict);
    }
  }
  if (profile.warmup_steps < 0 || profile.warmup_steps > 1000) {
    return Invalid("profile.warmup_steps", "must be in [0, 1000]", absl::StrCat(profile.warmup_steps));
  }
  if (profile.steps < 1 || profile.steps > 100) {
    return Invalid("profile.steps", "must be in [1, 100] (profiled steps; a trace grows with each)",
                   absl::StrCat(profile.steps));
  }
  if (peak_flops.has_value() &&
      !(s = RealInRange("peak_flops", *peak_flops, 0, kMaxPeakFlops, /*lo_open=*/true, " FLOP/s (or unset)")).ok()) {
    return s;
  }
  if (auto st = lora.Validate(); !st.ok()) return st;
  if (lora.enabled && fp32_master_weights) {
    return Invalid("fp32_master_weights",
                   "does not apply to LoRA (the base is frozen; spec.lora.dtype sets the adapters' dtype)", "true");
  }
  return absl::OkStatus();
}

absl::Status CheckEnvironment(const TrainConfig& c, const Environment& env) {
  const bool names_cuda = absl::StartsWith(c.device, "cuda");
  if (names_cuda && env.gpus == 0) {
    return Invalid("device", absl::StrCat("names a GPU but ", env.name, " has no GPU: use \"auto\" or \"cpu\""),
                   c.device);
  }
  if (absl::StartsWith(c.device, "cuda:")) {
    int index = 0;
    if (!absl::SimpleAtoi(c.device.substr(5), &index) || index >= env.gpus) {
      return Invalid("device", absl::StrCat("names a GPU a job on ", env.name, " does not see (it sees ", env.gpus,
                                            env.gpus == 1 ? " GPU, as cuda:0" : " GPUs, cuda:0 to cuda:" ,
                                            env.gpus == 1 ? "" : absl::StrCat(env.gpus - 1),
                                            "): use \"auto\" or \"cuda\""),
                     c.device);
    }
  }
  const int host_gpus = env.host_gpus >= 0 ? env.host_gpus : env.gpus;
  if (c.gpus > 1 && c.device != "cpu" && c.gpus > host_gpus) {
    return Invalid("gpus", absl::StrCat("asks for ", c.gpus, " GPUs but ", env.name, " has ", host_gpus,
                                        ": ask for at most ", host_gpus, host_gpus == 0 ? " (or use device \"cpu\")" : ""),
                   absl::StrCat(c.gpus));
  }
  const KernelChoice k = c.Kernels();
  if (!k.any()) return absl::OkStatus();
  const bool on_gpu = names_cuda || (c.device == "auto" && env.gpus > 0);
  if (!on_gpu) {
    return Invalid("kernel_set",
                   absl::StrCat("uses ftd's fused CUDA kernels (", k.ToString(), "), which need a GPU, but ",
                                c.device == "cpu" ? "spec.device is \"cpu\"" : absl::StrCat(env.name, " has no GPU"),
                                ": use \"eager\" in kernel_set and spec.kernels"),
                   KernelSetName(c.kernel_set));
  }
  if (k[KernelOp::kMatmul] && env.gpu_compute_capability > 0 &&
      env.gpu_compute_capability < kFp8MinComputeCapability) {
    return Invalid(c.kernels.count("matmul") ? "kernels.matmul" : "kernel_set",
                   absl::StrCat("uses FP8 matmuls, which need a GPU of compute capability 8.9 or newer (Ada, Hopper, "
                                "Blackwell), but ", env.name, "'s GPU is ", env.gpu_compute_capability / 10, ".",
                                env.gpu_compute_capability % 10, ": use kernel_set \"fused\" and no matmul override"),
                   "fp8");
  }
  if (!env.fused_kernels) {
    return Invalid("kernel_set",
                   absl::StrCat("uses ftd's fused CUDA kernels (", k.ToString(), "), but this ftd-worker was built "
                                "without them (no nvcc at build time): use kernel_set \"eager\" or rebuild with CUDA"),
                   KernelSetName(c.kernel_set));
  }
  return absl::OkStatus();
}

bool KernelChoice::any() const {
  for (size_t i = 0; i < fused.size(); ++i) {
    if (fused[i] && static_cast<KernelOp>(i) != KernelOp::kLora) return true;
  }
  return false;
}

namespace {
constexpr size_t kMatmulIndex = static_cast<size_t>(KernelOp::kMatmul);
}  // namespace

std::string KernelChoice::ToString() const {
  std::vector<std::string> eager, fusedv;
  for (size_t i = 0; i < fused.size(); ++i) {
    if (i != kMatmulIndex) (fused[i] ? fusedv : eager).push_back(kKernelOpNames[i]);
  }
  const bool fp8 = fused[kMatmulIndex];
  if (eager.empty()) return fp8 ? "fp8" : "fused";
  const std::string base = fusedv.empty() ? "eager" : absl::StrCat("fused (eager: ", absl::StrJoin(eager, ", "), ")");
  return fp8 ? absl::StrCat(base, ", fp8 matmul") : base;
}

KernelSet KernelChoice::Label() const {
  bool all = true, none = true;
  for (size_t i = 0; i < fused.size(); ++i) {
    if (i == kMatmulIndex) continue;
    all = all && fused[i];
    none = none && !fused[i];
  }
  if (fused[kMatmulIndex]) return all ? KernelSet::kFp8 : KernelSet::kMixed;
  return all ? KernelSet::kFused : none ? KernelSet::kEager : KernelSet::kMixed;
}

KernelChoice TrainConfig::Kernels() const {
  KernelChoice c;
  for (size_t i = 0; i < kKernelOpNames.size(); ++i) {
    // matmul: fp8 or the bf16 GEMM; every other op: fused (in the fused and fp8 sets) or eager.
    const KernelSet on = i == kMatmulIndex ? KernelSet::kFp8 : KernelSet::kFused;
    c.fused[i] = kernel_set == on || (i != kMatmulIndex && kernel_set == KernelSet::kFp8);
    auto it = kernels.find(std::string(kKernelOpNames[i]));
    if (it != kernels.end()) c.fused[i] = it->second == on;
  }
  return c;
}

double LearningRate(const OptimizerConfig& opt, const ScheduleConfig& sched, int64_t step,
                    int64_t total_steps) {
  if (sched.warmup_steps > 0 && step < sched.warmup_steps) {
    return opt.lr * static_cast<double>(step + 1) / static_cast<double>(sched.warmup_steps);
  }
  if (sched.kind == "constant") return opt.lr;
  const int64_t decay_steps = total_steps - sched.warmup_steps;
  if (decay_steps <= 1) return opt.lr;
  const double progress =
      static_cast<double>(step - sched.warmup_steps) / static_cast<double>(decay_steps - 1);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(1.0, progress)));
  return opt.lr * (sched.min_lr_ratio + (1.0 - sched.min_lr_ratio) * cosine);
}

std::string TrainConfig::ModelOrigin() const {
  if (!model.preset.empty()) return "preset " + model.preset;
  if (!model.config_path.empty()) return "spec.model.config_path";
  if (!model.weights_path.empty()) return "the config.json of spec.model.weights_path";
  return "the default model";
}

}  // namespace ftd::spec
