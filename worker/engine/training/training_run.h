// The training run's state and its parts, shared by the files that define them (private to the
// engine; RunTraining in engine.h is the public entry):
//   trainer.cc             the run and its step, in the fixed order; RunTraining's error boundary
//   trainer_setup.cc       device, allocator, model, data, optimizer, resume; the local environment
//   trainer_ranks.cc       data parallel: joining the ranks, agreeing on a step, the global gradient
//                          norm, ZeRO's gather of the updated weights, the ranks' stats
//   trainer_checkpoint.cc  writing a checkpoint (and, with several ranks, its barriers)
//   trainer_report.cc      the step's metrics, held-out evaluation, the profile
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/record_function.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "worker/engine/training/checkpoint.h"
#include "worker/engine/distributed/data_parallel.h"
#include "worker/engine/engine.h"
#include "worker/engine/model/fused_ops.h"
#include "worker/engine/core/gpu_monitor.h"
#include "worker/engine/model/model.h"
#include "worker/engine/training/optimizer.h"
#include "worker/engine/training/profiler.h"
#include "worker/engine/training/step_graph.h"
#include "worker/engine/core/token_data.h"

namespace ftd::engine {

// One run, in three parts: Setup (device, model, data, optimizer, resume), Step (one optimizer step
// in the fixed order above) and Report (the step's metrics, the profile). A part that ends the run
// returns false with the outcome in sum_.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& cfg, const RunHooks& hooks, const RankInfo& rank)
      : cfg_(cfg), hooks_(hooks), rank_(rank) {}

  RunSummary Run();

 private:
  void Log(std::string_view line) const {
    if (!hooks_.on_log) return;
    if (world_ > 1) {
      hooks_.on_log(absl::StrCat("rank ", rank_.rank, ": ", absl::string_view(line.data(), line.size())));
    } else {
      hooks_.on_log(line);
    }
  }
  bool lead() const { return rank_.rank == 0; }  // writes the model and reports
  // ZeRO-2: this rank keeps the reduced gradients of the tensors it owns only.
  bool shard_grads() const { return world_ > 1 && cfg_.optimizer.shard_state && cfg_.optimizer.shard_grads; }
  bool Fail(Outcome o, std::string msg) {
    sum_.outcome = o;
    sum_.message = std::move(msg);
    return false;
  }
  // A micro-batch on the device: inputs, shifted labels (-100 where masked) and, for rows holding
  // several documents, their positions and block-diagonal mask.
  struct DeviceBatch {
    torch::Tensor ids, labels;
    PackedLayout layout;
  };
  bool Setup();
  void ConfigureAllocator();  // before the run's first CUDA allocation
  bool SetupRanks(const std::vector<torch::Tensor>& trainable);
  bool Step(int64_t step);
  // Data-parallel: the sums over the ranks of the step's stop requests and token counts.
  void AgreeOnStep(bool* stop, bool* skip_checkpoint, int64_t* real_tokens, int64_t* loss_tokens);
  // ZeRO-1: every parameter from the rank that updated it.
  void GatherUpdatedWeights();
  // The global L2 norm of the step's gradients.
  torch::Tensor GlobalGradNorm();
  // Data-parallel: each rank's `row` (the same length on every rank), all ranks' rows in rank order.
  std::vector<double> ShareRows(const std::vector<double>& row);
  // Data-parallel: every rank's GPU peak, communication wait and GPU sample (`own_gpu`, its own
  // GPU's) of the step, to rank 0's report; job_gpu_ = the job's GPUs as one (CombineGpuSamples).
  void ShareRankStats(const GpuMonitor::Sample& own_gpu);
  // A sample of the job's GPUs as one: this rank's GPU, or with several ranks all of theirs
  // (a collective: every rank calls it).
  GpuMonitor::Sample ReadJobGpus();
  void Report(double loss, double norm, double lr, double dt, int64_t real_tokens, int64_t loss_tokens);
  DeviceBatch Upload(MicroBatch& mb) const;
  double Evaluate();  // the mean masked loss over every held-out row
  // Writes a checkpoint of the current state unless it is the one last written or resumed from.
  bool Checkpoint();
  static double NowS() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  const TrainConfig& cfg_;
  const RunHooks& hooks_;
  const RankInfo& rank_;
  int world_ = 1;                      // data-parallel ranks (cfg_.gpus)
  std::unique_ptr<Ranks> ranks_;       // world_ > 1
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<StepGraph> graph_;                           // spec.kernel_tuning.cuda_graphs
  std::optional<c10::cuda::CUDAStreamGuard> graph_stream_;     // the graph's stream, for the whole run
  std::vector<torch::Tensor> trainable_;
  std::vector<int> owner_;             // ZeRO-1/2: the rank that updates each trainable tensor
  double comm_wait_s_ = 0;             // the last step's
  uint64_t max_rank_peak_ = 0;
  uint64_t grad_bytes_ = 0;            // the last step's gradients on this rank (GradBytes)
  RunSummary sum_;
  torch::Device device_{torch::kCPU};
  KernelChoice kernels_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<TokenData> data_;
  std::unique_ptr<TokenData> eval_data_;  // held-out rows, if any
  std::optional<AdamW> opt_;
  TrainerState state_;
  int64_t saved_step_ = -1;  // the step of the checkpoint last written or resumed from
  WriteEta write_eta_;        // predicts each checkpoint write from the rate of the ones before
  double peak_flops_ = 0, flops_per_token_ = 0;
  int64_t tokens_per_step_ = 0;
  MicroBatch host_;
  bool phase_times_ = false;
  std::vector<at::cuda::CUDAEvent> events_;  // phase boundaries (phase_times_)
  std::unique_ptr<GpuMonitor> gpu_;          // NVML on this rank's GPU: energy over whole steps (too coarse for one)
  GpuMonitor::Sample job_gpu_;               // the step's sample of the job's GPUs (every rank's, summed)
  double job_gpu_t_ = 0;                     // when it was read (NowS)
  bool energy_started_ = false;              // energy_ has its start: every GPU of the job was read at setup
  EnergyWindow energy_;
  double step_time_ewma_ = -1;               // s; every step's wall time, weight kEtaWeight on the newest
  static constexpr double kEtaWeight = 0.2;
  std::optional<StepProfiler> profiler_;
  int64_t profile_from_ = -1;
  std::chrono::steady_clock::time_point profile_t0_;
};

}  // namespace ftd::engine
