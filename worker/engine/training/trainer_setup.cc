// A training run's setup: the device (and its CUDA allocator's settings), the model with its
// kernels, weights and LoRA adapters, the data streams, the optimizer (sharded under ZeRO), the
// state resumed from the newest checkpoint, and what the reports need (peak FLOPs, the GPU monitor,
// the profiler, CUDA graphs). Also what the worker asks of this machine before a run: its
// environment (GPUs, fused kernels, compute capability) and the device a spec names.
#include "worker/engine/training/training_run.h"

#include <algorithm>
#include <cstdlib>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "spec/peak_memory.h"
#include "worker/data/dataset.h"

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

// Where the files beside a checkpoint's weights come from: the config ModelConfigFor read (none
// for a preset), generation_config.json beside it, and the tokenizer the data uses (or the one in
// model.weights_path).
HfModelSources ModelFilesFor(const TrainConfig& cfg) {
  HfModelSources src;
  if (cfg.model.preset.empty() && !cfg.model.config_path.empty()) {
    src.config_path = cfg.model.config_path;
    src.config_field = "spec.model.config_path";
  } else if (cfg.model.preset.empty() && !cfg.model.weights_path.empty()) {
    src.config_path = cfg.model.weights_path;
    src.config_field = "spec.model.weights_path";
  }
  if (!cfg.data.tokenizer_path.empty()) {
    src.tokenizer_dir = cfg.data.tokenizer_path;
    src.tokenizer_field = "spec.data.tokenizer_path";
  } else if (!cfg.model.weights_path.empty()) {
    src.tokenizer_dir = cfg.model.weights_path;
    src.tokenizer_field = "spec.model.weights_path";
  }
  if (cfg.data.format == "chat") src.chat_template = data::kLlama3ChatTemplate;
  return src;
}

}  // namespace

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
  if (auto s = spec::CheckSequenceLength(*mc, cfg_.seq_len, cfg_.ModelOrigin()); !s.ok()) {
    return Fail(Outcome::kInvalidSpec, std::string(s.message()));
  }
  if (kernels_[KernelOp::kMatmul]) {
    if (auto s = fp8::CheckShapes(*mc); !s.ok()) return Fail(Outcome::kInvalidSpec, std::string(s.message()));
  }
  auto model_or = LlamaModel::Create(*mc, device_, dtype, cfg_.seed);
  if (!model_or.ok()) return Fail(Outcome::kInvalidSpec, std::string(model_or.status().message()));
  model_ = *std::move(model_or);
  LlamaModel& model = *model_;
  model.SetKernels(kernels_, cfg_.kernel_tuning);
  model.SetActivationCheckpointing(cfg_.activation_checkpointing, cfg_.full_checkpoint_layers);
  if (!cfg_.checkpoint.dir.empty()) {  // read once, written with every checkpoint
    auto files = HfModelFiles::Read(ModelFilesFor(cfg_));
    if (!files.ok()) return Fail(Outcome::kInvalidSpec, std::string(files.status().message()));
    model.SetHfFiles(*std::move(files));
  }
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
        // A spec that disagrees with the checkpoint (its batch, data, kind or shapes) is an invalid
        // spec; an unreadable or corrupt checkpoint is a failure of the run.
        return Fail(absl::IsInvalidArgument(s) ? Outcome::kInvalidSpec : Outcome::kFailed, std::string(s.message()));
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
  if (hooks_.open_gpu_monitor) {
    gpu_ = hooks_.open_gpu_monitor();
  } else if (device_.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device_.index());
    gpu_ = GpuMonitor::Open(absl::StrFormat("%04x:%02x:%02x.0", props->pciDomainID, props->pciBusID, props->pciDeviceID));
  } else {
    gpu_ = GpuMonitor::Unavailable("a CPU run");
  }
  if (!gpu_->available()) Log(absl::StrCat("GPU power and energy unavailable: ", gpu_->reason()));
  // Power, energy and J/token are the job's: with several ranks every rank's GPU counts, and they
  // are reported only when every one of them can be read.
  if (const auto job = ReadJobGpus(); job.ok) {
    energy_.Start(NowS(), job.energy_j, state_.tokens_total, state_.step);
    energy_started_ = true;
  } else if (world_ > 1 && gpu_->available()) {
    Log("GPU power and energy unavailable: another rank's GPU cannot be read");
  }
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

}  // namespace ftd::engine
