// The training engine's public face: run a training job described by a TrainConfig and get one
// StepMetrics per reported step. No LibTorch, no protobuf: callers (the standalone CLI, the agent
// that talks to ftd) include only this header.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "worker/engine/progress.h"
#include "worker/engine/spec_types.h"

namespace ftd::engine {

struct StepMetrics {
  int64_t step = 0;         // 1-based optimizer step
  int64_t total_steps = 0;
  double loss = 0;          // mean next-token cross-entropy over the step's non-ignored tokens
  double grad_norm = 0;     // global L2 norm before clipping
  double lr = 0;
  int64_t tokens = 0;       // tokens in this step (batch × seq_len × accumulation)
  int64_t tokens_total = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;
  uint64_t peak_mem_allocated_bytes = 0;  // GPU high-water marks during the step (0 on CPU)
  uint64_t peak_mem_reserved_bytes = 0;
  uint64_t peak_rss_bytes = 0;            // host high-water mark of the process
  double mfu = 0;                         // 0 when the device's peak FLOP/s is unknown
  // NVML (GPU runs where libnvidia-ml loads; otherwise nvml_available is false and these are 0).
  bool nvml_available = false;
  double energy_total_j = 0;     // since the run started
  double step_energy_j = 0;      // per step, over the most recent steps spanning >= 1 s
  double joules_per_token = 0;   // over the same steps
  double power_w = 0;            // mean over the same steps
  double gpu_utilization = 0;    // 0..1
  uint64_t gpu_memory_used_bytes = 0;
  int64_t real_tokens = 0;           // tokens of this step that are not padding
  int64_t loss_tokens = 0;           // tokens of this step the loss counts
  std::optional<double> eval_loss;   // mean masked loss on the held-out rows, on eval steps
};

// One row of a profile: an op (a LibTorch op such as aten::mm, or one of ftd's kernels such as
// ftd::rmsnorm_forward) in one phase, averaged over the profiled steps.
struct OpStat {
  std::string name;
  std::string phase;     // forward | backward | optimizer | other
  std::string category;  // attention | matmul | rmsnorm | swiglu | rope | cross_entropy | optimizer | other
  double device_ms = 0;  // self device time per step (kernels this op launched itself); CPU runs: self CPU time
  double share = 0;      // of the step's device time
  double calls = 0;      // per step
  double host_ms = 0;    // self host time per step
};

struct ProfileSummary {
  std::string device;           // "cuda" or "cpu": what device_ms measures
  int steps = 0;                // profiled steps
  double step_wall_ms = 0;      // wall time per profiled step
  double step_device_ms = 0;    // device time per step (sum over all ops)
  std::vector<OpStat> ops;      // by device_ms, largest first
  std::vector<std::pair<std::string, double>> category_ms;  // device ms per step by category
  std::string trace_path;       // Chrome trace JSON (empty if not written)
  uint64_t trace_bytes = 0;
};

enum class Outcome { kSucceeded, kFailed, kNonFinite, kOutOfMemory, kInvalidSpec, kCancelled };
const char* OutcomeName(Outcome o);

struct RunSummary {
  Outcome outcome = Outcome::kFailed;
  std::string message;
  int64_t steps_done = 0;
  double final_loss = 0;
  std::optional<double> final_eval_loss;  // the last held-out loss (data.eval_path or eval_fraction)
  std::string last_checkpoint;  // directory of the newest checkpoint written or resumed from
};

struct RunHooks {
  std::function<void(const StepMetrics&)> on_step;    // every log_every steps and the last
  std::function<void(std::string_view)> on_log;       // human-readable progress lines
  const std::atomic<bool>* stop = nullptr;            // set to end the run after the current step
  // Set (with stop) to end it without the checkpoint a stop otherwise writes (a plain cancel).
  const std::atomic<bool>* skip_checkpoint = nullptr;
  std::function<void(const ProfileSummary&)> on_profile;  // profiled runs: once, after the profiled steps
  // Outside training steps: loading the weights (load_weights), opening the data (load_data),
  // resuming (load_checkpoint) and writing a checkpoint (save_checkpoint). Called from the training
  // thread at the start of each phase (done 0), at most every 250 ms while its bytes move, and at
  // its end (done == total), so a watchdog that sees neither a step nor progress for long knows
  // the run is stuck rather than slow. total_bytes may grow as a phase opens what it reads.
  ProgressFn on_progress;
  // After every optimizer step, whatever log_every is: liveness for a watchdog. Training thread.
  std::function<void(int64_t step)> on_step_done;
};

// Runs the whole job: builds or loads the model, resumes from a checkpoint if asked, trains,
// checkpoints. Never throws; every failure is in the summary.
RunSummary RunTraining(const TrainConfig& config, const RunHooks& hooks);

// The device a config resolves to ("cpu", "cuda:0"), and whether CUDA is present at all.
std::string ResolveDevice(const std::string& requested);
int CudaDeviceCount();

}  // namespace ftd::engine
