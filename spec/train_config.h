// Plain training configuration: the engine's view of a TrainSpec (proto/ftd/v1/job_spec.proto),
// with every default in one place and validated up front. No LibTorch, no protobuf.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
  bool shard_state = false;   // gpus > 1: AdamW state sharded over the ranks (ZeRO-1)
  bool shard_grads = false;   // with shard_state: reduced gradients sharded the same way (ZeRO-2)
  bool overlap = false;       // per-layer update inside backward, gradients freed early; needs grad_clip 0
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
// kMatmul: the decoder layers' linear projections (q, k, v, o, gate, up, down; not lm_head): bf16
// GEMMs (eager or fused), or FP8 GEMMs (fp8: E4M3 forward, E5M2 gradients, per-tensor scaling).
enum class KernelOp { kRmsNorm, kRope, kSwiGlu, kCrossEntropy, kLinearCrossEntropy, kAdamW, kLora, kMatmul };
inline constexpr std::array<const char*, 8> kKernelOpNames = {
    "rmsnorm", "rope", "swiglu", "cross_entropy", "linear_cross_entropy", "adamw", "lora", "matmul"};

// The kernel sets. A spec's kernel_set is eager, fused or fp8 (fused, with FP8 matmuls); each per-op
// override eager or fused, and `matmul` also fp8. A run whose overrides split its ops is mixed. The
// metrics' kernel_set label and a profile's kernel_set are these names, so the spec, the worker and
// the daemon speak one vocabulary.
enum class KernelSet { kEager, kFused, kMixed, kFp8 };
inline constexpr std::array<const char*, 4> kKernelSetNames = {"eager", "fused", "mixed", "fp8"};
inline const char* KernelSetName(KernelSet k) { return kKernelSetNames[static_cast<size_t>(k)]; }
// "eager", "fused" or "fp8" (what a spec may say); mixed and anything else: nullopt.
std::optional<KernelSet> ParseKernelSet(std::string_view name);

// FP8 tensor cores: compute capability 8.9 (Ada) and newer (Hopper 9.0, Blackwell 10.x).
inline constexpr int kFp8MinComputeCapability = 89;  // major * 10 + minor

// Which ops run our fused CUDA kernels (true) and which LibTorch's composite ops (false); for kMatmul,
// true is FP8 and false the bf16 GEMM.
struct KernelChoice {
  std::array<bool, kKernelOpNames.size()> fused{};
  bool operator[](KernelOp op) const { return fused[static_cast<size_t>(op)]; }
  bool any() const;  // any op on ftd's CUDA kernels (which need a GPU; `lora` runs anywhere)
  // "eager", "fused", "fp8", "fused (eager: linear_cross_entropy)", "eager, fp8 matmul"
  std::string ToString() const;
  KernelSet Label() const;  // eager, fused, fp8 or mixed
};

// Tuning of ftd's fused kernels (spec.kernel_tuning); 0 takes the kernel's default.
inline constexpr int32_t kDefaultLinearCrossEntropyChunkRows = 2048;
inline constexpr int32_t kMaxLinearCrossEntropyChunkRows = 65'536;
struct KernelTuning {
  int32_t linear_cross_entropy_chunk_rows = 0;  // rows per logits chunk; 0: kDefaultLinearCrossEntropyChunkRows
  bool fused_projections = false;               // one GEMM for q/k/v and one for gate/up
  bool cuda_graphs = false;                     // forward+backward replayed as one CUDA graph
  bool fp8_fast_accum = false;                  // FP8 forward GEMMs without fp32 promotion between K blocks
  int32_t LinearCrossEntropyChunkRows() const {
    return linear_cross_entropy_chunk_rows > 0 ? linear_cross_entropy_chunk_rows : kDefaultLinearCrossEntropyChunkRows;
  }
};

// What each decoder layer saves for backward (spec.activation_checkpointing; torchtune's and
// torchtitan's vocabulary). kSelective: the RMSNorm outputs and the SwiGLU product are freed after
// their consumers' forward and recomputed in backward (the GEMMs' other inputs are kept); kFull: only
// each layer's input is kept and the layer is rerun in backward.
enum class ActivationCheckpointing { kNone, kSelective, kFull };
inline constexpr std::array<const char*, 3> kActivationCheckpointingNames = {"none", "selective", "full"};
inline const char* ActivationCheckpointingName(ActivationCheckpointing a) {
  return kActivationCheckpointingNames[static_cast<size_t>(a)];
}
std::optional<ActivationCheckpointing> ParseActivationCheckpointing(std::string_view name);

// Coarse static upper bounds on the numeric fields (docs/job-spec.md, "Limits"): far above any real
// job, low enough that no value overflows the arithmetic done with it or asks for absurd memory
// before the memory check sees it (ftd refuses a job whose memory would not fit at submit). Seeds take any value; optimizer.lr any finite value > 0 (a huge
// one is how a test provokes a non-finite run).
inline constexpr int64_t kMaxSteps = 1'000'000'000;       // steps, warmup_steps, every_steps, log_every
inline constexpr int32_t kMaxBatchSize = 65'536;          // sequences per micro-batch
inline constexpr int32_t kMaxSeqLen = 1'048'576;          // tokens per sequence
inline constexpr int32_t kMaxGradAccumSteps = 65'536;
inline constexpr int32_t kMaxGpus = 64;     // spec.gpus: ranks of one job on one host
inline constexpr int32_t kMaxCpuRanks = 8;  // spec.gpus with device "cpu"
inline constexpr int32_t kMaxKeepLast = 1'000'000;
inline constexpr double kMaxEps = 1;
inline constexpr double kMaxWeightDecay = 100;
inline constexpr double kMaxGradClip = 1e12;
inline constexpr double kMaxPeakFlops = 1e18;  // FLOP/s

// Where a job will run, for the checks that depend on it (CheckEnvironment): ftd describes itself at
// submit, ftd-worker its machine at start.
struct Environment {
  std::string name = "this machine";  // in messages: "this machine", "this ftd"
  int gpus = 0;                       // CUDA devices a job sees, as cuda:0 .. cuda:gpus-1
  bool fused_kernels = true;          // ftd-worker was built with ftd's CUDA kernels (nvcc)
  int gpu_compute_capability = 0;     // major * 10 + minor of the least capable GPU; 0: unknown
  int host_gpus = -1;                 // GPUs one job may ask for with spec.gpus (-1: as gpus)
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
  int32_t gpus = 1;              // data-parallel ranks (one process each); batch_size is per rank
  std::string device = "auto";   // "auto" | "cpu" | "cuda" | "cuda:N"
  std::string dtype = "auto";    // "auto" | "bf16" | "fp32"
  bool fp32_master_weights = false;
  uint64_t seed = 0;             // init seed
  int32_t log_every = 1;         // steps
  KernelSet kernel_set = KernelSet::kEager;  // eager | fused | fp8: the default for every op
  std::map<std::string, KernelSet> kernels;  // per-op overrides: op name -> eager | fused (| fp8 for matmul)
  KernelTuning kernel_tuning;
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kNone;
  int32_t full_checkpoint_layers = 0;  // layers: the first N fully checkpointed, the rest as above
  bool expandable_segments = false;  // the CUDA caching allocator's expandable segments
  std::optional<double> peak_flops;  // FLOP/s; unset: looked up from the device name
  ProfileConfig profile;
  LoraConfig lora;  // enabled: LoRA fine-tuning of a frozen base (spec/lora_config.h)

  // Checks every field on its own terms (ranges, names, combinations); the message names the field
  // (as in the JSON spec) and the fix. What depends on the machine is CheckEnvironment's.
  absl::Status Validate() const;
  // Where the model's architecture comes from, for messages: "preset tiny", "spec.model.config_path",
  // "the config.json of spec.model.weights_path", "the default model".
  std::string ModelOrigin() const;
  // kernel_set with the per-op overrides applied (call after Validate).
  KernelChoice Kernels() const;
};

// What a valid config asks of the place it runs: a GPU for the device it names and for ftd's fused
// kernels, and kernels built into the worker. The one place "fused needs a GPU" is decided.
absl::Status CheckEnvironment(const TrainConfig& c, const Environment& env);

// The learning rate at 0-based optimizer step `step` (docs/job-spec.md, "schedule").
double LearningRate(const OptimizerConfig& opt, const ScheduleConfig& sched, int64_t step,
                    int64_t total_steps);

}  // namespace ftd::spec
