// Plain training configuration: the engine's view of a TrainSpec (proto/ftd/v1/job_spec.proto),
// with every default in one place and validated up front. No LibTorch, no protobuf.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "spec/lora_config.h"

namespace ftd::spec {

struct ModelSource {
  std::string preset;        // "llama-3.1-8b", "tiny", or empty
  std::string config_path;   // HF config.json (file or directory), or empty
  std::string weights_path;  // HF safetensors directory, or empty (random init)
};

// docs/data-format.md describes the formats and how rows are built from them.
struct DataConfig {
  std::string path;                // token file or JSONL; empty = embedded arithmetic dataset
  std::string format = "tokens";   // "tokens" | "text" | "prompt_completion" | "chat"
  std::string token_dtype = "uint16";  // "uint16" | "uint32" (format tokens)
  bool shuffle = false;
  uint64_t seed = 1234;            // shuffle, eval split and the embedded dataset
  std::string tokenizer_path;      // directory with tokenizer.json; empty = model.weights_path
  std::string text_field = "text";
  std::string prompt_field = "prompt";
  std::string completion_field = "completion";
  std::string messages_field = "messages";
  std::string role_field = "role";
  std::string content_field = "content";
  std::string on_bad_line = "refuse";  // "refuse" | "skip"
  std::string sequence = "pack";       // "pack" | "pad"
  std::string eval_path;               // held-out file in the same format
  double eval_fraction = 0;            // or a seeded fraction of the rows, in [0, 1)
  int64_t eval_every_steps = 0;        // steps; 0 = only at the end (when there is held-out data)
  std::string cache_dir;               // tokenized JSONL; empty = $FTD_DATA_CACHE or ~/.cache/ftd/data

  bool jsonl() const { return format != "tokens"; }
  bool has_eval() const { return !eval_path.empty() || eval_fraction > 0; }
};

struct OptimizerConfig {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled; applied to tensors of rank >= 2 only
  double grad_clip = 1.0;     // max global L2 norm; 0 disables
};

struct ScheduleConfig {
  std::string kind = "constant";  // "constant" | "cosine"
  int64_t warmup_steps = 0;       // steps
  double min_lr_ratio = 0.1;      // cosine floor as a fraction of lr
};

struct CheckpointConfig {
  std::string dir;          // empty: no checkpoints
  int64_t every_steps = 0;  // steps; 0 = only at the end
  bool resume = true;
  int32_t keep_last = 0;    // 0 = keep all
};

// A profiling run (job kind PROFILE): warm-up steps, then profiled steps; no checkpoints.
struct ProfileConfig {
  bool enabled = false;
  int32_t warmup_steps = 3;  // steps before the profiler starts
  int32_t steps = 2;         // profiled steps
  std::string trace_path;    // where the Chrome trace goes; empty: not written
};

// The ops a kernel set chooses an implementation for (docs/job-spec.md, "Kernel sets").
// kLora: LoRA's adapter terms, grouped per shared input and accumulated into the frozen projection's
// GEMM (LibTorch ops, any device; eager: PEFT's per-module composite ops).
enum class KernelOp { kRmsNorm, kRope, kSwiGlu, kCrossEntropy, kLinearCrossEntropy, kAdamW, kLora };
inline constexpr std::array<const char*, 7> kKernelOpNames = {
    "rmsnorm", "rope", "swiglu", "cross_entropy", "linear_cross_entropy", "adamw", "lora"};

// Which ops run our fused CUDA kernels (true) and which LibTorch's composite ops (false).
struct KernelChoice {
  std::array<bool, kKernelOpNames.size()> fused{};
  bool operator[](KernelOp op) const { return fused[static_cast<size_t>(op)]; }
  bool any() const;  // any op on ftd's CUDA kernels (which need a GPU; `lora` runs anywhere)
  std::string ToString() const;  // "eager", "fused", or "fused (eager: linear_cross_entropy)"
  const char* Label() const;     // a closed set for metrics: "eager", "fused" or "mixed"
};

struct TrainConfig {
  ModelSource model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  CheckpointConfig checkpoint;
  int64_t steps = 100;           // optimizer steps
  int32_t batch_size = 8;        // sequences per micro-batch
  int32_t seq_len = 128;         // tokens per sequence
  int32_t grad_accum_steps = 1;  // micro-batches per optimizer step
  std::string device = "auto";   // "auto" | "cpu" | "cuda" | "cuda:N"
  std::string dtype = "auto";    // "auto" | "bf16" | "fp32"
  bool fp32_master_weights = false;
  uint64_t seed = 0;             // init seed
  int32_t log_every = 1;         // steps
  std::string kernel_set = "eager";  // "eager" | "fused": the default for every op
  std::map<std::string, std::string> kernels;  // per-op overrides: op name -> "eager" | "fused"
  std::optional<double> peak_flops;  // FLOP/s; unset: looked up from the device name
  ProfileConfig profile;
  LoraConfig lora;  // enabled: LoRA fine-tuning of a frozen base (spec/lora_config.h)

  // Checks every field; the message names the field (as in the JSON spec) and the fix.
  absl::Status Validate() const;
  // kernel_set with the per-op overrides applied (call after Validate).
  KernelChoice Kernels() const;
};

// The learning rate at 0-based optimizer step `step` (docs/job-spec.md, "schedule").
double LearningRate(const OptimizerConfig& opt, const ScheduleConfig& sched, int64_t step,
                    int64_t total_steps);

}  // namespace ftd::spec
