// The training engine's public face: run a training job described by a TrainConfig and get one
// StepMetrics per reported step. No LibTorch, no protobuf: callers (the standalone CLI, the agent
// that talks to ftd) include only this header.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "worker/engine/train_config.h"

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
};

enum class Outcome { kSucceeded, kFailed, kNonFinite, kOutOfMemory, kInvalidSpec, kCancelled };
const char* OutcomeName(Outcome o);

struct RunSummary {
  Outcome outcome = Outcome::kFailed;
  std::string message;
  int64_t steps_done = 0;
  double final_loss = 0;
  std::string last_checkpoint;  // directory of the newest checkpoint written or resumed from
};

struct RunHooks {
  std::function<void(const StepMetrics&)> on_step;    // every log_every steps and the last
  std::function<void(std::string_view)> on_log;       // human-readable progress lines
  const std::atomic<bool>* stop = nullptr;            // set to end the run after the current step
};

// Runs the whole job: builds or loads the model, resumes from a checkpoint if asked, trains,
// checkpoints. Never throws; every failure is in the summary.
RunSummary RunTraining(const TrainConfig& config, const RunHooks& hooks);

// The device a config resolves to ("cpu", "cuda:0"), and whether CUDA is present at all.
std::string ResolveDevice(const std::string& requested);
int CudaDeviceCount();

}  // namespace ftd::engine
