// The training loop. Step order (fixed): fetch -> forward/backward per micro-batch (accumulate)
// -> grad norm -> finite check on loss and grad norm (on the device) -> clip -> AdamW step
// (skipped when the check failed) -> report -> checkpoint. A failed finite check stops the run
// after checkpointing the last good state. With spec.optimizer.overlap the norm, the finite check
// and the update run group by group inside the last micro-batch's backward (optimizer.h).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/record_function.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "spec/peak_memory.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/data_parallel.h"
#include "worker/engine/engine.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/gpu_monitor.h"
#include "worker/engine/model.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/profiler.h"
#include "worker/engine/step_graph.h"
#include "worker/engine/token_data.h"

namespace ftd::engine {

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

spec::Environment LocalEnvironment() {
  spec::Environment env;
  env.gpus = CudaDeviceCount();
  env.fused_kernels = fused::Available();
  for (int i = 0; i < env.gpus; ++i) {
    const auto* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(i));
    const int cc = p->major * 10 + p->minor;
    env.gpu_compute_capability = i == 0 ? cc : std::min(env.gpu_compute_capability, cc);
  }
  return env;
}

std::string ResolveDevice(const std::string& requested) {
  if (requested == "auto") return CudaDeviceCount() > 0 ? "cuda:0" : "cpu";
  if (requested == "cuda") return "cuda:0";
  return requested;
}

namespace {

uint64_t PeakRss() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

// Dense bf16 tensor-core peak of the device, for MFU; 0 when unknown (docs/performance.md).
double PeakFlops(const torch::Device& d) {
  if (!d.is_cuda()) return 0;
  const std::string name = at::cuda::getDeviceProperties(d.index())->name;
  if (absl::StrContains(name, "H100") || absl::StrContains(name, "H200") || absl::StrContains(name, "H800") ||
      absl::StrContains(name, "GH200")) {
    return 989.4e12;
  }
  if (absl::StrContains(name, "GB300") || absl::StrContains(name, "B300")) return 2.5e15;
  if (absl::StrContains(name, "GB200") || absl::StrContains(name, "B200")) return 2.25e15;
  if (absl::StrContains(name, "A100")) return 312e12;
  return 0;
}

absl::StatusOr<LlamaConfig> ModelConfigFor(const TrainConfig& cfg, bool cuda) {
  if (!cfg.model.preset.empty()) return PresetLlamaConfig(cfg.model.preset);
  if (!cfg.model.config_path.empty()) return ReadLlamaConfig(cfg.model.config_path, "spec.model.config_path");
  if (!cfg.model.weights_path.empty()) return ReadLlamaConfig(cfg.model.weights_path, "spec.model.weights_path");
  return PresetLlamaConfig(cuda ? "llama-3.1-8b" : "tiny");
}

// One run, in three parts: Setup (device, model, data, optimizer, resume), Step (one optimizer step
// in the fixed order above) and Report (the step's metrics, the profile). A part that ends the run
// returns false with the outcome in sum_.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& cfg, const RunHooks& hooks, const RankInfo& rank)
      : cfg_(cfg), hooks_(hooks), rank_(rank) {}

  RunSummary Run() {
    if (!Setup()) return sum_;
    for (int64_t step = state_.step; step < cfg_.steps; ++step) {
      if (!Step(step)) return sum_;
    }
    if (!Checkpoint()) return sum_;
    sum_.outcome = Outcome::kSucceeded;
    sum_.message = absl::StrCat("trained ", state_.step, " steps");
    return sum_;
  }

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
  // Data-parallel: every rank's GPU peak and communication wait of the step, to rank 0's report.
  void ShareRankStats();
  void Report(double loss, double norm, double lr, double dt, int64_t real_tokens, int64_t loss_tokens);
  DeviceBatch Upload(MicroBatch& mb) const;
  double Evaluate();  // the mean masked loss over every held-out row
  // Writes a checkpoint of the current state unless it is the one last written or resumed from.
  bool Checkpoint();

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
  std::unique_ptr<GpuMonitor> gpu_;          // NVML: energy over whole steps (too coarse for one)
  EnergyWindow energy_;
  std::optional<StepProfiler> profiler_;
  int64_t profile_from_ = -1;
  std::chrono::steady_clock::time_point profile_t0_;
};

// The bytes of the storages that hold the gradients of `params` (one shared by several, such as a
// reduced bucket, counted once): what the gradients take at the step, views and all.
uint64_t GradBytes(const std::vector<torch::Tensor>& params) {
  std::set<const c10::StorageImpl*> seen;
  uint64_t n = 0;
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (g.defined() && seen.insert(g.storage().unsafeGetStorageImpl()).second) n += g.storage().nbytes();
  }
  return n;
}

double NowS() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool TrainingRun::Setup() {
  world_ = cfg_.gpus;
  std::string dev_name = ResolveDevice(cfg_.device);
  if (world_ > 1 && dev_name == "cuda:0") dev_name = absl::StrCat("cuda:", rank_.rank);  // rank r: the job's r-th GPU
  try {
    device_ = torch::Device(dev_name);
  } catch (const c10::Error&) {
    return Fail(Outcome::kInvalidSpec, absl::StrCat("spec.device \"", cfg_.device, "\" is not a device name"));
  }
  if (device_.is_cuda()) {
    c10::cuda::set_device(device_.index());
    ConfigureAllocator();
  }
  const bool bf16 = cfg_.dtype == "bf16" || (cfg_.dtype == "auto" && device_.is_cuda());
  const torch::ScalarType dtype = bf16 ? torch::kBFloat16 : torch::kFloat;
  kernels_ = cfg_.Kernels();  // where they run was checked (CheckEnvironment)

  auto mc = ModelConfigFor(cfg_, device_.is_cuda());
  if (!mc.ok()) return Fail(Outcome::kInvalidSpec, std::string(mc.status().message()));
  if (kernels_[KernelOp::kMatmul]) {
    if (auto s = fp8::CheckShapes(*mc); !s.ok()) return Fail(Outcome::kInvalidSpec, std::string(s.message()));
  }
  auto model_or = LlamaModel::Create(*mc, device_, dtype, cfg_.seed);
  if (!model_or.ok()) return Fail(Outcome::kInvalidSpec, std::string(model_or.status().message()));
  model_ = *std::move(model_or);
  LlamaModel& model = *model_;
  model.SetKernels(kernels_, cfg_.kernel_tuning);
  model.SetActivationCheckpointing(cfg_.activation_checkpointing, cfg_.full_checkpoint_layers);
  if (!cfg_.model.weights_path.empty()) {
    ProgressMeter meter(hooks_.on_progress, ProgressPhase::kLoadWeights, 0);
    if (auto s = model.LoadWeights(cfg_.model.weights_path, &meter); !s.ok()) {
      return Fail(Outcome::kInvalidSpec, absl::StrCat("spec.model.weights_path: ", s.message()));
    }
    meter.Finish();
  }
  if (cfg_.lora.enabled) {
    if (auto s = model.EnableLora(cfg_.lora, cfg_.seed); !s.ok()) return Fail(Outcome::kInvalidSpec, std::string(s.message()));
  }
  DataConfig data_cfg = cfg_.data;
  if (data_cfg.tokenizer_path.empty()) data_cfg.tokenizer_path = cfg_.model.weights_path;
  // Every rank opens the same stream with the batch of all ranks and takes its part of each micro-batch.
  const int64_t global_batch = static_cast<int64_t>(cfg_.batch_size) * world_;
  auto data_or = TokenData::Open(data_cfg, cfg_.seq_len, global_batch, mc->vocab_size, hooks_.on_progress);
  if (!data_or.ok()) return Fail(Outcome::kInvalidSpec, std::string(data_or.status().message()));
  data_ = *std::move(data_or);
  Log(absl::StrCat("data: ", data_->summary(), "; ", data_->num_rows(), " training rows"));
  if (cfg_.data.has_eval()) {
    auto e = TokenData::Open(data_cfg, cfg_.seq_len, cfg_.batch_size, mc->vocab_size, hooks_.on_progress,
                             TokenData::Split::kEval);
    if (!e.ok()) return Fail(Outcome::kInvalidSpec, std::string(e.status().message()));
    eval_data_ = *std::move(e);
    Log(absl::StrCat("held-out data: ", cfg_.data.eval_path.empty() ? "a seeded fraction of the rows" : eval_data_->summary(),
                     "; ", eval_data_->num_rows(), " rows"));
  }
  std::vector<std::pair<std::string, torch::Tensor>> opt_params = model.trainable_parameters();
  for (const auto& [name, t] : opt_params) trainable_.push_back(t);
  if (world_ > 1) {
    if (cfg_.optimizer.shard_state) owner_ = ShardOwners(trainable_, world_);
    if (!SetupRanks(trainable_)) return false;
    if (cfg_.optimizer.shard_state) {
      if (rank_.coalesced_gather) {
        Log(ranks_->backend().supportsCoalescing()
                ? "ZeRO-1: the updated weights go out as one coalesced group of broadcasts"
                : absl::StrCat("ZeRO-1: ", ranks_->backend_name(),
                               " cannot coalesce broadcasts (--coalesced-gather); one after another"));
      }
      std::vector<std::pair<std::string, torch::Tensor>> mine;
      for (size_t k = 0; k < opt_params.size(); ++k) {
        if (owner_[k] == rank_.rank) mine.push_back(opt_params[k]);
      }
      opt_params = std::move(mine);
    }
  }
  opt_.emplace(opt_params, cfg_.optimizer, cfg_.fp32_master_weights, kernels_[KernelOp::kAdamW]);
  if (cfg_.optimizer.overlap) opt_->EnableOverlap();  // one GPU only (validated): the reducer hooks the same tensors

  state_.batch_size = global_batch;
  state_.seq_len = cfg_.seq_len;
  state_.shuffle = cfg_.data.shuffle;
  state_.data_seed = cfg_.data.seed;
  state_.data_path = cfg_.data.path;
  if (!cfg_.checkpoint.dir.empty() && cfg_.checkpoint.resume) {
    auto latest = LatestCheckpoint(cfg_.checkpoint.dir);
    if (!latest.ok()) return Fail(Outcome::kFailed, std::string(latest.status().message()));
    if (latest->has_value()) {
      if (auto s = LoadCheckpoint(**latest, &state_, &model, &*opt_, hooks_.on_progress); !s.ok()) {
        return Fail(Outcome::kFailed, std::string(s.message()));
      }
      model.WeightsChanged();
      sum_.last_checkpoint = **latest;
      saved_step_ = state_.step;
      Log(absl::StrCat("resumed from ", **latest, " at step ", state_.step));
    }
  }
  Log(absl::StrFormat("model: %.3fB parameters (%d layers, hidden %d, vocab %d), %s on %s, kernels %s; data: %d tokens",
                      static_cast<double>(mc->NumParameters()) / 1e9, mc->num_hidden_layers, mc->hidden_size,
                      mc->vocab_size, bf16 ? "bf16" : "fp32", device_.str(), kernels_.ToString(), data_->num_tokens()));
  Log(absl::StrCat("predicted ", spec::PredictPeakMemory(*mc, cfg_, device_.is_cuda()).ToString()));
  if (model.lora()) {
    int64_t n = 0;
    for (const auto& [name, t] : model.trainable_parameters()) n += t.numel();
    Log(absl::StrFormat("LoRA: rank %d, alpha %g (scale %g), %s adapters on %s; %d trainable parameters, base frozen",
                        cfg_.lora.rank, cfg_.lora.Alpha(), cfg_.lora.Scale(), cfg_.lora.dtype,
                        absl::StrJoin(cfg_.lora.target_modules, ","), n));
  }

  peak_flops_ = cfg_.peak_flops.value_or(PeakFlops(device_));
  flops_per_token_ = model.TrainingFlopsPerToken(cfg_.seq_len);
  tokens_per_step_ = global_batch * cfg_.seq_len * cfg_.grad_accum_steps;
  sum_.steps_done = state_.step;

  phase_times_ = device_.is_cuda() && hooks_.phase_times;
  for (int i = 0; phase_times_ && i < 4; ++i) events_.emplace_back(cudaEventDefault);
  if (device_.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device_.index());
    gpu_ = GpuMonitor::Open(absl::StrFormat("%04x:%02x:%02x.0", props->pciDomainID, props->pciBusID, props->pciDeviceID));
  } else {
    gpu_ = GpuMonitor::Unavailable("a CPU run");
  }
  if (!gpu_->available()) Log(absl::StrCat("GPU power and energy unavailable: ", gpu_->reason()));
  if (gpu_->available()) energy_.Start(NowS(), gpu_->Read().energy_j, state_.tokens_total, state_.step);
  if (world_ > 1) {
    Log(absl::StrFormat("data parallel: rank %d of %d on %s through %s, %d gradient buckets%s", rank_.rank, world_,
                        device_.str(), ranks_->backend_name(), reducer_->num_buckets(),
                        owner_.empty() ? ""
                                       : absl::StrFormat("; AdamW state%s sharded (%s): %d of %d tensors here",
                                                         shard_grads() ? " and gradients" : "",
                                                         shard_grads() ? "ZeRO-2" : "ZeRO-1", opt_params.size(),
                                                         trainable_.size())));
  }
  profiler_.emplace(device_.is_cuda());
  profile_from_ = cfg_.profile.enabled ? cfg_.profile.warmup_steps : -1;
  if (cfg_.kernel_tuning.cuda_graphs) {
    if (!device_.is_cuda()) {
      return Fail(Outcome::kInvalidSpec, "spec.kernel_tuning.cuda_graphs needs a CUDA device (set it false on the CPU)");
    }
    std::vector<torch::Tensor> params;
    for (const auto& [name, t] : model.trainable_parameters()) params.push_back(t);
    graph_ = std::make_unique<StepGraph>(&model, std::move(params));
    torch::cuda::synchronize(device_.index());  // what Setup queued on the default stream is done
    graph_stream_.emplace(graph_->stream());
    Log(absl::StrCat("CUDA graphs: forward+backward captured after ", StepGraph::kWarmupSteps, " eager steps"));
  }
  return true;
}

void TrainingRun::ConfigureAllocator() {
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const char* env = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  if (env != nullptr && *env != '\0') {
    Log(absl::StrCat("CUDA allocator: PYTORCH_CUDA_ALLOC_CONF=", env, " (from the environment; spec.expandable_segments ",
                     cfg_.expandable_segments ? "true" : "false", " not applied)"));
  } else if (cfg_.expandable_segments) {
    alloc::setAllocatorSettings("expandable_segments:True");
  }
  const bool expandable = alloc::CUDAAllocatorConfig::expandable_segments();
  // PyTorch turns the setting off (with a warning) where the driver lacks virtual memory management.
  const bool refused = cfg_.expandable_segments && !expandable && (env == nullptr || *env == '\0');
  Log(absl::StrCat("CUDA allocator: ", expandable ? "expandable" : "fixed-size", " segments",
                   refused ? " (spec.expandable_segments is true, but this platform does not support them)" : ""));
}

bool TrainingRun::SetupRanks(const std::vector<torch::Tensor>& trainable) {
  auto ranks = Ranks::Join(rank_.rank, world_, rank_.store_path, device_, std::chrono::seconds(rank_.timeout_s));
  if (!ranks.ok()) return Fail(Outcome::kFailed, std::string(ranks.status().message()));
  ranks_ = *std::move(ranks);
  // The same seed gives every rank the same initial weights; rank 0's are sent anyway, so that no
  // rank can start from others (a device whose initialisation differs, a file read differently).
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : model_->named_parameters()) {
    torch::Tensor p = t;
    ranks_->Broadcast(p, 0);
  }
  if (shard_grads() && device_.is_cuda() && ranks_->backend_name() != "nccl") {
    return Fail(Outcome::kInvalidSpec,
                absl::StrCat("spec.optimizer.shard_grads on GPUs needs NCCL, and this ftd-worker was built without "
                             "ProcessGroupNCCL (ranks join through ", ranks_->backend_name(),
                             "): set optimizer.shard_grads false, or rebuild with NCCL (docs/distributed.md)"));
  }
  const int64_t bucket_bytes = rank_.bucket_mib > 0 ? int64_t{rank_.bucket_mib} << 20 : GradReducer::kBucketBytes;
  reducer_ = std::make_unique<GradReducer>(*ranks_, trainable, bucket_bytes,
                                           shard_grads() ? owner_ : std::vector<int>{});
  Log(absl::StrCat(ranks_->backend_name(), ": ", reducer_->num_buckets(), " gradient buckets of about ",
                   bucket_bytes >> 20, " MiB", shard_grads() ? ", reduce-scattered" : ""));
  return true;
}

void TrainingRun::AgreeOnStep(bool* stop, bool* skip_checkpoint, int64_t* real_tokens, int64_t* loss_tokens) {
  // Doubles hold the counts exactly (far below 2^53).
  torch::Tensor v = torch::tensor({*stop ? 1.0 : 0.0, *skip_checkpoint ? 1.0 : 0.0, static_cast<double>(*real_tokens),
                                   static_cast<double>(*loss_tokens)},
                                  torch::TensorOptions().dtype(torch::kDouble))
                        .to(device_);
  ranks_->AllReduceSum(v);
  v = v.to(torch::kCPU);
  const double* d = v.data_ptr<double>();
  // One rank asked to stop (a signal reaches every rank of the job's group, not at the same step):
  // all stop after the same step. A cancel without checkpoint wins over a stop with one.
  *stop = d[0] > 0;
  *skip_checkpoint = d[1] > 0;
  *real_tokens = static_cast<int64_t>(d[2]);
  *loss_tokens = static_cast<int64_t>(d[3]);
}

void TrainingRun::GatherUpdatedWeights() {
  torch::NoGradGuard no_grad;
  (void)ranks_->BroadcastEach(trainable_, owner_, rank_.coalesced_gather);
}

torch::Tensor TrainingRun::GlobalGradNorm() {
  if (owner_.empty()) return opt_->GradNorm();  // one rank, or every rank holds every reduced gradient
  std::vector<torch::Tensor> grads;
  for (auto& t : trainable_) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  if (!shard_grads()) return GradNorm(grads, kernels_[KernelOp::kAdamW]);
  // ZeRO-2: each rank holds its own tensors' gradients; one scalar all-reduce adds the squares.
  torch::Tensor sq = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  if (!grads.empty()) sq += GradNorm(grads, kernels_[KernelOp::kAdamW]).to(torch::kDouble).square();
  ranks_->AllReduceSum(sq);
  return sq.sqrt().to(torch::kFloat).reshape({});
}

void TrainingRun::ShareRankStats() {
  uint64_t peak = 0;
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    peak = static_cast<uint64_t>(stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
  }
  torch::Tensor v = torch::zeros({3 * world_}, torch::TensorOptions().dtype(torch::kDouble));
  v[rank_.rank] = static_cast<double>(peak);
  v[world_ + rank_.rank] = reducer_->ReadWait();
  v[2 * world_ + rank_.rank] = static_cast<double>(grad_bytes_);
  v = v.to(device_);
  ranks_->AllReduceSum(v);
  v = v.to(torch::kCPU);
  const double* d = v.data_ptr<double>();
  comm_wait_s_ = 0;
  max_rank_peak_ = 0;
  std::vector<std::string> peaks;
  sum_.rank_grad_bytes.assign(static_cast<size_t>(world_), 0);
  for (int r = 0; r < world_; ++r) {
    sum_.rank_grad_bytes[static_cast<size_t>(r)] = static_cast<uint64_t>(d[2 * world_ + r]);
    comm_wait_s_ = std::max(comm_wait_s_, d[world_ + r]);  // the step waits for the slowest rank
    max_rank_peak_ = std::max(max_rank_peak_, static_cast<uint64_t>(d[r]));
    peaks.push_back(absl::StrFormat("%.2f", d[r] / (1 << 30)));
  }
  if (lead() && device_.is_cuda() && (state_.step == 0 || state_.step + 1 == cfg_.steps)) {
    Log(absl::StrCat("GPU peak memory allocated per rank (GiB): ", absl::StrJoin(peaks, ", ")));
  }
}

TrainingRun::DeviceBatch TrainingRun::Upload(MicroBatch& mb) const {
  auto as_tensor = [&](std::vector<int64_t>& v) {
    return torch::from_blob(v.data(), {mb.rows, mb.seq}, torch::kInt64).clone().to(device_);
  };
  DeviceBatch d{as_tensor(mb.input_ids), as_tensor(mb.labels), {}};
  if (mb.multi_document) d.layout = PackedLayout::FromSegments(as_tensor(mb.positions), as_tensor(mb.segments));
  return d;
}

double TrainingRun::Evaluate() {
  torch::Tensor total = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  int64_t count = 0;
  MicroBatch eb;
  for (int64_t first = 0; first < eval_data_->num_rows(); first += cfg_.batch_size) {
    eval_data_->Rows(first, std::min<int64_t>(cfg_.batch_size, eval_data_->num_rows() - first), &eb);
    count += eb.loss_tokens;
    auto d = Upload(eb);
    total += model_->EvalLossSum(d.ids, d.labels, d.layout).to(torch::kDouble);
  }
  return total.item<double>() / static_cast<double>(std::max<int64_t>(count, 1));
}

bool TrainingRun::Checkpoint() {
  if (cfg_.checkpoint.dir.empty()) return true;
  // The last step's checkpoint also holds the merged model when spec.lora.merge asks for it.
  const bool merged = model_->lora() && cfg_.lora.merge && state_.step == cfg_.steps;
  // Nothing to write where the state is that of the checkpoint just written or resumed from
  // (unless that one lacks the merged model this one should hold).
  if (state_.step == saved_step_ && (!merged || std::filesystem::exists(sum_.last_checkpoint + "/merged"))) {
    return true;
  }
  // Each write's progress carries the predicted time left (the daemon waits that long for a
  // stopping worker, and ftctl shows it).
  ProgressFn progress;
  if (hooks_.on_progress) {
    progress = [this](const Progress& p) {
      Progress with_eta = p;
      with_eta.eta_s = write_eta_.Observe(p, std::chrono::steady_clock::now());
      hooks_.on_progress(with_eta);
    };
  }
  // A plain cancel (stop without a checkpoint) that comes mid-write stops the write too.
  auto plain_cancel = [this] {
    return hooks_.stop != nullptr && hooks_.stop->load() && hooks_.skip_checkpoint != nullptr &&
           hooks_.skip_checkpoint->load();
  };
  const auto t0 = std::chrono::steady_clock::now();
  // Data parallel: rank 0 writes the checkpoint; under ZeRO-1 every rank writes its optimizer
  // shard into it (CheckpointRanks). The others learn it is in place at the barrier. With several
  // ranks a plain cancel does not stop the write: every rank must reach the same barriers, so the
  // write runs to its end and the ranks stop after it.
  absl::StatusOr<std::string> dir;
  if (world_ > 1 && owner_.empty() && !lead()) {
    ranks_->Barrier();
    dir = (std::filesystem::path(cfg_.checkpoint.dir) / absl::StrFormat("step-%08d", state_.step)).string();
  } else {
    CheckpointRanks cr;
    if (!owner_.empty()) cr = {rank_.rank, world_, [this] { ranks_->Barrier(); }};
    std::function<bool()> abort;
    if (world_ == 1) abort = plain_cancel;
    dir = SaveCheckpoint(cfg_.checkpoint.dir, state_, *model_, *opt_, cfg_.checkpoint.keep_last, merged, progress,
                         std::move(abort), cr);
    if (dir.ok() && world_ > 1 && owner_.empty()) ranks_->Barrier();
  }
  if (absl::IsCancelled(dir.status())) {
    return Fail(Outcome::kCancelled, absl::StrCat("stopped on request while writing the checkpoint of step ",
                                                  state_.step, ", without a checkpoint"));
  }
  if (!dir.ok()) return Fail(Outcome::kFailed, std::string(dir.status().message()));
  sum_.last_checkpoint = *dir;
  saved_step_ = state_.step;
  Log(absl::StrFormat("checkpoint %s (written in %.1f s)", *dir,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  return true;
}

bool TrainingRun::Step(int64_t step) {
  auto mark = [&](size_t i) {
    if (phase_times_) events_[i].record();
  };
  if (step == profile_from_) {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    Log(absl::StrCat("profiling steps ", step + 1, " to ", cfg_.steps));
    profiler_->Start();
    profile_t0_ = std::chrono::steady_clock::now();
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
  // Fetch every micro-batch first: the loss is normalised by the step's non-ignored tokens (of
  // every rank: each rank takes its part of each micro-batch).
  std::vector<DeviceBatch> batches;
  int64_t real_tokens = 0, loss_tokens = 0;
  for (int32_t a = 0; a < cfg_.grad_accum_steps; ++a) {
    data_->Batch(state_.micro_batches + a, &host_, rank_.rank, world_);
    real_tokens += host_.real_tokens;
    loss_tokens += host_.loss_tokens;
    batches.push_back(Upload(host_));
  }
  bool stop = hooks_.stop != nullptr && hooks_.stop->load();
  bool skip_checkpoint = hooks_.skip_checkpoint != nullptr && hooks_.skip_checkpoint->load();
  if (world_ > 1) AgreeOnStep(&stop, &skip_checkpoint, &real_tokens, &loss_tokens);
  if (stop) {
    if (skip_checkpoint) {
      return Fail(Outcome::kCancelled, absl::StrCat("stopped on request after step ", state_.step, ", without a checkpoint"));
    }
    if (!Checkpoint()) return false;
    return Fail(Outcome::kCancelled, absl::StrCat("stopped on request after step ", state_.step));
  }
  mark(0);
  // The step's unmasked labels, counted on the host as the batches were built.
  torch::Tensor count = torch::full({}, static_cast<double>(std::max<int64_t>(loss_tokens, 1)),
                                    torch::TensorOptions().dtype(torch::kFloat).device(device_));
  torch::Tensor loss_acc = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
  const double lr = LearningRate(cfg_.optimizer, cfg_.schedule, step, cfg_.steps);
  // spec.optimizer.overlap: the last micro-batch's backward updates each layer as its gradients
  // become final (optimizer.h); grad_clip is 0 and there is one rank there (validated).
  const bool overlap = cfg_.optimizer.overlap;
  for (size_t i = 0; i < batches.size(); ++i) {
    auto& b = batches[i];
    if (reducer_ && i + 1 == batches.size()) reducer_->Arm();  // this backward completes the gradients
    torch::Tensor loss;
    {
      RECORD_USER_SCOPE(kPhaseForward);
      if (graph_) {  // forward and backward (one replay once captured)
        loss = graph_->Run(b.ids, b.labels, count, b.layout);
        loss_acc += loss;
        continue;
      }
      loss = model_->LossMean(b.ids, b.labels, count, b.layout);
    }
    if (overlap && i + 1 == batches.size()) opt_->BeginOverlap(lr, loss_acc + loss.detach());
    {
      RECORD_USER_SCOPE(kPhaseBackward);
      loss.backward();
    }
    loss_acc += loss.detach();
  }
  if (reducer_) {
    reducer_->Finish();  // the gradients are now the sums over the ranks
    ranks_->AllReduceSum(loss_acc);
  }
  mark(1);
  at::RecordFunction optimizer_scope(at::RecordScope::USER_SCOPE);
  if (optimizer_scope.isActive()) optimizer_scope.before(kPhaseOptimizer);
  torch::Tensor norm;
  if (overlap) {
    norm = opt_->EndOverlap();
    mark(2);
  } else {
    norm = GlobalGradNorm();
    // The finite check runs on the device: a non-finite loss or norm skips the update inside the
    // fused kernel (found_inf), so the host synchronises once per step, after the optimizer's
    // kernels are queued, rather than between backward and the update.
    auto found_inf = torch::logical_not(torch::isfinite(loss_acc).logical_and(torch::isfinite(norm))).to(torch::kFloat);
    if (cfg_.optimizer.grad_clip > 0) opt_->Clip(norm, cfg_.optimizer.grad_clip);
    mark(2);
    opt_->Step(lr, found_inf);
  }
  model_->WeightsChanged();  // FP8 copies of the weights are made again before the next forward
  grad_bytes_ = GradBytes(trainable_);
  opt_->ZeroGrad();
  if (!owner_.empty()) {
    GatherUpdatedWeights();
    for (auto& t : trainable_) t.mutable_grad() = torch::Tensor();
  }
  optimizer_scope.end();
  mark(3);
  auto both = torch::stack({loss_acc, norm}).to(torch::kCPU);
  const double loss_v = both[0].item<double>(), norm_v = both[1].item<double>();
  if (!std::isfinite(loss_v) || !std::isfinite(norm_v)) {
    sum_.final_loss = loss_v;
    const std::string what = absl::StrCat("non-finite ", std::isfinite(loss_v) ? "gradient norm" : "loss", " at step ",
                                          step + 1, " (loss ", loss_v, ", grad norm ", norm_v, "); ");
    if (overlap && std::isfinite(loss_v)) {
      // The layers updated before the first non-finite gradient keep their update: that state is
      // not the last good one, so it is not written.
      return Fail(Outcome::kNonFinite,
                  absl::StrCat(what, "with optimizer.overlap the layers whose gradients came before it were updated, "
                                     "so this state is not checkpointed; resume from the last checkpoint (lower "
                                     "optimizer.lr, or set optimizer.overlap false and use grad_clip)"));
    }
    if (!Checkpoint()) return false;
    return Fail(Outcome::kNonFinite, absl::StrCat(what, "the update was skipped (lower optimizer.lr or use grad_clip)"));
  }
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  if (world_ > 1) ShareRankStats();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (phase_times_) {
    Log(absl::StrFormat("phases step %d: forward+backward %.2f ms, norm+clip %.2f ms, optimizer %.2f ms, wall %.2f ms",
                        step + 1, events_[0].elapsed_time(events_[1]), events_[1].elapsed_time(events_[2]),
                        events_[2].elapsed_time(events_[3]), dt * 1e3));
  }
  state_.step = step + 1;
  state_.micro_batches += cfg_.grad_accum_steps;
  state_.tokens_total += tokens_per_step_;
  sum_.steps_done = state_.step;
  sum_.final_loss = loss_v;
  Report(loss_v, norm_v, lr, dt, real_tokens, loss_tokens);
  if (cfg_.checkpoint.every_steps > 0 && state_.step % cfg_.checkpoint.every_steps == 0 && state_.step < cfg_.steps) {
    return Checkpoint();
  }
  return true;
}

void TrainingRun::Report(double loss, double norm, double lr, double dt, int64_t real_tokens, int64_t loss_tokens) {
  StepMetrics m;
  m.step = state_.step;
  m.total_steps = cfg_.steps;
  m.loss = loss;
  m.grad_norm = norm;
  m.lr = lr;
  m.tokens = tokens_per_step_;
  m.tokens_total = state_.tokens_total;
  m.step_time_s = dt;
  m.tokens_per_s = static_cast<double>(tokens_per_step_) / dt;
  m.real_tokens = real_tokens;
  m.loss_tokens = loss_tokens;
  m.ranks = world_;
  m.comm_wait_s = comm_wait_s_;
  m.max_rank_peak_mem_allocated_bytes = max_rank_peak_;
  if (lead() && eval_data_ &&
      ((cfg_.data.eval_every_steps > 0 && state_.step % cfg_.data.eval_every_steps == 0) || state_.step == cfg_.steps)) {
    m.eval_loss = Evaluate();
    sum_.final_eval_loss = m.eval_loss;
  }
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m.peak_mem_allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes[agg].peak);
    m.peak_mem_reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes[agg].peak);
  }
  if (world_ == 1) {
    m.max_rank_peak_mem_allocated_bytes = m.peak_mem_allocated_bytes;
    sum_.rank_grad_bytes = {grad_bytes_};
  }
  m.peak_rss_bytes = PeakRss();
  m.mfu = peak_flops_ > 0 ? flops_per_token_ * m.tokens_per_s / peak_flops_ : 0.0;
  if (gpu_->available()) {
    const auto sample = gpu_->Read();
    if (sample.ok) {
      energy_.AddStep(NowS(), sample.energy_j, state_.tokens_total, state_.step);
      const auto es = energy_.Current();
      m.nvml_available = true;
      m.energy_total_j = es.energy_total_j;
      m.step_energy_j = es.step_energy_j;
      m.joules_per_token = es.joules_per_token;
      m.power_w = es.power_w;
      m.gpu_utilization = sample.utilization;
      m.gpu_memory_used_bytes = sample.memory_used_bytes;
    }
  }
  if (hooks_.on_step_done) hooks_.on_step_done(state_.step);
  if (lead() && hooks_.on_step && (state_.step % cfg_.log_every == 0 || state_.step == cfg_.steps || m.eval_loss)) {
    hooks_.on_step(m);
  }
  if (profile_from_ >= 0 && state_.step == cfg_.steps) {
    const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - profile_t0_).count();
    const int profiled = static_cast<int>(cfg_.steps - profile_from_);
    auto summary = profiler_->Stop(profiled, wall_ms / profiled, cfg_.profile.trace_path);
    Log(absl::StrFormat("profile: %d steps, %.1f ms device time per step (%s), %d ops", profiled,
                        summary.step_device_ms, summary.device, summary.ops.size()));
    if (lead() && hooks_.on_profile) hooks_.on_profile(summary);
  }
}

}  // namespace

RunSummary RunTraining(const TrainConfig& config, const RunHooks& hooks, const RankInfo& rank) {
  // A profiling run: warm-up and profiled steps only, nothing resumed or checkpointed.
  TrainConfig cfg = config;
  if (cfg.profile.enabled) {
    cfg.steps = cfg.profile.warmup_steps + cfg.profile.steps;
    cfg.checkpoint.dir.clear();
  }
  try {
    return TrainingRun(cfg, hooks, rank).Run();
  } catch (const c10::OutOfMemoryError& e) {
    RunSummary sum;
    sum.outcome = Outcome::kOutOfMemory;
    sum.message = absl::StrCat("GPU out of memory: ", e.what_without_backtrace(),
                               " (lower batch_size or seq_len, or raise grad_accum_steps)");
    return sum;
  } catch (const c10::Error& e) {
    RunSummary sum;
    sum.outcome = Outcome::kFailed;
    sum.message = e.what_without_backtrace();
    return sum;
  } catch (const std::exception& e) {
    RunSummary sum;
    sum.outcome = Outcome::kFailed;
    sum.message = e.what();
    return sum;
  }
}

}  // namespace ftd::engine
