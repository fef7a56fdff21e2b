// The training engine's public face: run a training job described by a TrainConfig and get one
// StepMetrics per reported step. No LibTorch, no protobuf: callers (the standalone CLI, the agent
// that talks to ftd) include only this header.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "worker/engine/core/gpu_monitor.h"
#include "worker/engine/core/progress.h"
#include "worker/engine/spec_types.h"

namespace ftd::engine {

// One reported optimizer step. The fields are listed once, here: the struct, the protocol's
// StepReport (worker/reports.cc, whose test checks the proto has exactly these fields in this
// order) and a standalone run's step line (worker/main.cc) are all made from this list.
// X(type, name, meaning)
#define FTD_STEP_METRICS(X)                                                                           \
  X(int64_t, step, "1-based optimizer step")                                                          \
  X(int64_t, total_steps, "")                                                                         \
  X(double, loss, "mean next-token cross-entropy over the step's non-ignored tokens")                \
  X(double, grad_norm, "global L2 norm before clipping")                                             \
  X(double, lr, "")                                                                                   \
  X(int64_t, tokens, "tokens in this step (batch x seq_len x accumulation)")                         \
  X(int64_t, tokens_total, "")                                                                        \
  X(double, step_time_s, "")                                                                          \
  X(double, tokens_per_s, "")                                                                         \
  X(uint64_t, peak_mem_allocated_bytes, "GPU high-water marks during the step (0 on CPU)")           \
  X(uint64_t, peak_mem_reserved_bytes, "")                                                            \
  X(uint64_t, peak_rss_bytes, "host high-water mark of the process")                                 \
  X(double, mfu, "0 when the device's peak FLOP/s is unknown")                                       \
  X(bool, nvml_available, "NVML loaded on a GPU run; otherwise false and the fields below are 0")    \
  X(double, energy_total_j, "since the run started")                                                 \
  X(double, step_energy_j, "per step, over the most recent steps spanning >= 1 s")                   \
  X(double, joules_per_token, "over the same steps")                                                 \
  X(double, power_w, "mean over the same steps")                                                     \
  X(double, gpu_utilization, "0..1")                                                                  \
  X(uint64_t, gpu_memory_used_bytes, "")                                                              \
  X(int64_t, real_tokens, "tokens of this step that are not padding")                                \
  X(int64_t, loss_tokens, "tokens of this step the loss counts")                                     \
  X(std::optional<double>, eval_loss, "mean masked loss on the held-out rows, on eval steps")           \
  X(int64_t, ranks, "data-parallel ranks the step ran on (spec.gpus); tokens and tokens_per_s are theirs together") \
  X(double, comm_wait_s, "time the step waited for gradient reduction after backward (not overlapped)") \
  X(uint64_t, max_rank_peak_mem_allocated_bytes, "the largest GPU peak of the job's ranks (0 on CPU)")        \
  X(double, eta_s, "seconds left: steps left x the step time's moving average over every step (0.2 on the newest)")

// A metric as an optional: set ones are reported, unset optional ones are left out (null in JSON).
template <typename T>
std::optional<T> MetricValue(const T& v) {
  return v;
}
template <typename T>
std::optional<T> MetricValue(const std::optional<T>& v) {
  return v;
}

struct StepMetrics {
#define FTD_STEP_METRICS_FIELD(type, name, meaning) type name{};
  FTD_STEP_METRICS(FTD_STEP_METRICS_FIELD)
#undef FTD_STEP_METRICS_FIELD
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

using spec::Outcome;  // spec/run_outcome.h: how a run ended, with its name and exit code
using spec::OutcomeName;

struct RunSummary {
  Outcome outcome = Outcome::kFailed;
  std::string message;
  int64_t steps_done = 0;
  double final_loss = 0;
  std::optional<double> final_eval_loss;  // the last held-out loss (data.eval_path or eval_fraction)
  std::string last_checkpoint;  // directory of the newest checkpoint written or resumed from
  // Per rank, the bytes its gradients took at the last step (ZeRO-2: about 1/gpus of them).
  std::vector<uint64_t> rank_grad_bytes;
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
  // GPU runs: log the GPU time of each phase of every step (forward+backward, norm+clip, optimizer)
  // from CUDA events, which add no synchronisation (`ftd-worker run --phase-times`).
  bool phase_times = false;
  // This rank's GPU monitor instead of NVML's for the run's device, also on a CPU rank (a test
  // driver's fake: tests/fake_gpu_rank.cc). Empty: NVML on a GPU, none on a CPU.
  std::function<std::unique_ptr<GpuMonitor>()> open_gpu_monitor;
};

// One process of a data-parallel job (spec.gpus > 1; docs/distributed.md).
struct RankInfo {
  int rank = 0;            // 0 .. gpus-1; rank 0 writes the model and reports
  std::string store_path;  // the c10d FileStore the ranks of one attempt meet at (a new file per attempt)
  int timeout_s = 600;     // a collective or the rendezvous waiting longer than this fails the run
  // Communication levers, measured by bench/dist_bench.py (docs/distributed.md):
  int bucket_mib = 0;             // gradient all-reduce buckets of about this size; 0: GradReducer's default
  bool coalesced_gather = false;  // ZeRO-1: the updated weights as one coalesced group of broadcasts
  bool flat_reduce = false;       // unsharded: each bucket's gradients copied into one flat tensor and reduced
                                  // there (default: reduced where they are, as one coalesced group)
};

// Runs the whole job: builds or loads the model, resumes from a checkpoint if asked, trains,
// checkpoints. `config` was validated for this machine (spec::Validate with LocalEnvironment(), or
// Validate and CheckEnvironment). With config.gpus > 1 this process is rank `rank.rank` of them;
// only rank 0 calls on_step and on_profile. Never throws; every failure is in the summary.
RunSummary RunTraining(const TrainConfig& config, const RunHooks& hooks, const RankInfo& rank = {});

// The device a config resolves to ("cpu", "cuda:0"), and whether CUDA is present at all.
std::string ResolveDevice(const std::string& requested);
int CudaDeviceCount();
// This machine as a spec is checked against at the worker's start: its GPUs, and whether this
// build has ftd's fused CUDA kernels.
spec::Environment LocalEnvironment();

}  // namespace ftd::engine
