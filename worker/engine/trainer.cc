// The training loop. Step order (fixed): fetch -> forward/backward per micro-batch (accumulate)
// -> grad norm -> finite check on loss and grad norm (on the device) -> clip -> AdamW step
// (skipped when the check failed) -> report -> checkpoint. A failed finite check stops the run
// after checkpointing the last good state.
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/record_function.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "spec/peak_memory.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/engine.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/gpu_monitor.h"
#include "worker/engine/model.h"
#include "worker/engine/optimizer.h"
#include "worker/engine/profiler.h"
#include "worker/engine/token_data.h"

namespace ftd::engine {

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kSucceeded: return "SUCCEEDED";
    case Outcome::kFailed: return "FAILED";
    case Outcome::kNonFinite: return "NON_FINITE";
    case Outcome::kOutOfMemory: return "OUT_OF_MEMORY";
    case Outcome::kInvalidSpec: return "INVALID_SPEC";
    case Outcome::kCancelled: return "CANCELLED";
  }
  return "FAILED";
}

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

std::string ResolveDevice(const std::string& requested) {
  if (requested == "auto") return CudaDeviceCount() > 0 ? "cuda:0" : "cpu";
  if (requested == "cuda") return "cuda:0";
  return requested;
}

namespace {

struct Failure {
  Outcome outcome;
  std::string message;
};

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

RunSummary Run(const TrainConfig& cfg, const RunHooks& hooks) {
  RunSummary sum;
  auto log = [&](std::string_view line) {
    if (hooks.on_log) hooks.on_log(line);
  };
  auto fail = [&](Outcome o, std::string msg) {
    sum.outcome = o;
    sum.message = std::move(msg);
    return sum;
  };
  const std::string dev_name = ResolveDevice(cfg.device);
  torch::Device device(torch::kCPU);
  try {
    device = torch::Device(dev_name);
  } catch (const c10::Error&) {
    return fail(Outcome::kInvalidSpec, absl::StrCat("spec.device \"", cfg.device, "\" is not a device name"));
  }
  if (device.is_cuda() && device.index() >= CudaDeviceCount()) {
    return fail(Outcome::kInvalidSpec,
                absl::StrCat("spec.device is \"", cfg.device, "\" but this machine has ", CudaDeviceCount(),
                             " CUDA devices (use \"auto\" or \"cpu\")"));
  }
  if (device.is_cuda()) c10::cuda::set_device(device.index());
  const bool bf16 = cfg.dtype == "bf16" || (cfg.dtype == "auto" && device.is_cuda());
  const torch::ScalarType dtype = bf16 ? torch::kBFloat16 : torch::kFloat;

  const KernelChoice kernels = cfg.Kernels();
  if (kernels.any() && !fused::Available()) {
    return fail(Outcome::kInvalidSpec, "spec.kernel_set: this ftd-worker was built without the fused CUDA kernels (no "
                                       "nvcc at build time); use kernel_set \"eager\"");
  }
  if (kernels.any() && !device.is_cuda()) {
    return fail(Outcome::kInvalidSpec, absl::StrCat("spec.kernel_set: the fused CUDA kernels (", kernels.ToString(),
                                                    ") need a GPU and this run is on the CPU; use kernel_set \"eager\""));
  }

  auto mc = ModelConfigFor(cfg, device.is_cuda());
  if (!mc.ok()) return fail(Outcome::kInvalidSpec, std::string(mc.status().message()));
  auto model_or = LlamaModel::Create(*mc, device, dtype, cfg.seed);
  if (!model_or.ok()) return fail(Outcome::kInvalidSpec, std::string(model_or.status().message()));
  LlamaModel& model = **model_or;
  model.SetKernels(kernels);
  if (!cfg.model.weights_path.empty()) {
    ProgressMeter meter(hooks.on_progress, ProgressPhase::kLoadWeights, 0);
    if (auto s = model.LoadWeights(cfg.model.weights_path, &meter); !s.ok()) {
      return fail(Outcome::kInvalidSpec, absl::StrCat("spec.model.weights_path: ", s.message()));
    }
    meter.Finish();
  }
  if (cfg.lora.enabled) {
    if (auto s = model.EnableLora(cfg.lora, cfg.seed); !s.ok()) return fail(Outcome::kInvalidSpec, std::string(s.message()));
  }
  DataConfig data_cfg = cfg.data;
  if (data_cfg.tokenizer_path.empty()) data_cfg.tokenizer_path = cfg.model.weights_path;
  auto data_or = TokenData::Open(data_cfg, cfg.seq_len, cfg.batch_size, mc->vocab_size, hooks.on_progress);
  if (!data_or.ok()) return fail(Outcome::kInvalidSpec, std::string(data_or.status().message()));
  TokenData& data = **data_or;
  log(absl::StrCat("data: ", data.summary(), "; ", data.num_rows(), " training rows"));
  std::unique_ptr<TokenData> eval_data;
  if (cfg.data.has_eval()) {
    auto e = TokenData::Open(data_cfg, cfg.seq_len, cfg.batch_size, mc->vocab_size, hooks.on_progress,
                             TokenData::Split::kEval);
    if (!e.ok()) return fail(Outcome::kInvalidSpec, std::string(e.status().message()));
    eval_data = *std::move(e);
    log(absl::StrCat("held-out data: ", cfg.data.eval_path.empty() ? "a seeded fraction of the rows" : eval_data->summary(),
                     "; ", eval_data->num_rows(), " rows"));
  }
  AdamW opt(model.trainable_parameters(), cfg.optimizer, cfg.fp32_master_weights, kernels[KernelOp::kAdamW]);

  TrainerState state;
  int64_t saved_step = -1;  // the step of the checkpoint last written or resumed from
  state.batch_size = cfg.batch_size;
  state.seq_len = cfg.seq_len;
  state.shuffle = cfg.data.shuffle;
  state.data_seed = cfg.data.seed;
  state.data_path = cfg.data.path;
  if (!cfg.checkpoint.dir.empty() && cfg.checkpoint.resume) {
    auto latest = LatestCheckpoint(cfg.checkpoint.dir);
    if (!latest.ok()) return fail(Outcome::kFailed, std::string(latest.status().message()));
    if (latest->has_value()) {
      if (auto s = LoadCheckpoint(**latest, &state, &model, &opt, hooks.on_progress); !s.ok()) {
        return fail(Outcome::kFailed, std::string(s.message()));
      }
      sum.last_checkpoint = **latest;
      saved_step = state.step;
      log(absl::StrCat("resumed from ", **latest, " at step ", state.step));
    }
  }
  log(absl::StrFormat("model: %.3fB parameters (%d layers, hidden %d, vocab %d), %s on %s, kernels %s; data: %d tokens",
                      static_cast<double>(mc->NumParameters()) / 1e9, mc->num_hidden_layers, mc->hidden_size,
                      mc->vocab_size, bf16 ? "bf16" : "fp32", device.str(), kernels.ToString(), data.num_tokens()));
  log(absl::StrCat("predicted ", spec::PredictPeakMemory(*mc, cfg, device.is_cuda()).ToString()));
  if (model.lora()) {
    int64_t n = 0;
    for (const auto& [name, t] : model.trainable_parameters()) n += t.numel();
    log(absl::StrFormat("LoRA: rank %d, alpha %g (scale %g), %s adapters on %s; %d trainable parameters, base frozen",
                        cfg.lora.rank, cfg.lora.Alpha(), cfg.lora.Scale(), cfg.lora.dtype,
                        absl::StrJoin(cfg.lora.target_modules, ","), n));
  }

  const double peak = cfg.peak_flops.value_or(PeakFlops(device));
  const double flops_per_token = model.TrainingFlopsPerToken(cfg.seq_len);
  const int64_t tokens_per_step = static_cast<int64_t>(cfg.batch_size) * cfg.seq_len * cfg.grad_accum_steps;
  MicroBatch host;
  sum.steps_done = state.step;
  // A micro-batch on the device: inputs, shifted labels (-100 where masked) and, for rows holding
  // several documents, their positions and block-diagonal mask.
  struct DeviceBatch {
    torch::Tensor ids, labels;
    PackedLayout layout;
  };
  auto upload = [&](MicroBatch& mb) {
    auto as_tensor = [&](std::vector<int64_t>& v) {
      return torch::from_blob(v.data(), {mb.rows, mb.seq}, torch::kInt64).clone().to(device);
    };
    DeviceBatch d{as_tensor(mb.input_ids), as_tensor(mb.labels), {}};
    if (mb.multi_document) d.layout = PackedLayout::FromSegments(as_tensor(mb.positions), as_tensor(mb.segments));
    return d;
  };
  // The mean masked loss over every held-out row.
  auto evaluate = [&]() -> double {
    torch::Tensor total = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    int64_t count = 0;
    MicroBatch eb;
    for (int64_t first = 0; first < eval_data->num_rows(); first += cfg.batch_size) {
      eval_data->Rows(first, std::min<int64_t>(cfg.batch_size, eval_data->num_rows() - first), &eb);
      count += eb.loss_tokens;
      auto d = upload(eb);
      total += model.EvalLossSum(d.ids, d.labels, d.layout).to(torch::kDouble);
    }
    return total.item<double>() / static_cast<double>(std::max<int64_t>(count, 1));
  };

  // The last step's checkpoint also holds the merged model when spec.lora.merge asks for it.
  auto checkpoint = [&]() -> absl::Status {
    if (cfg.checkpoint.dir.empty()) return absl::OkStatus();
    const bool merged = model.lora() && cfg.lora.merge && state.step == cfg.steps;
    // Nothing to write where the state is that of the checkpoint just written or resumed from
    // (unless that one lacks the merged model this one should hold).
    if (state.step == saved_step && (!merged || std::filesystem::exists(sum.last_checkpoint + "/merged"))) {
      return absl::OkStatus();
    }
    auto dir = SaveCheckpoint(cfg.checkpoint.dir, state, model, opt, cfg.checkpoint.keep_last, merged,
                              hooks.on_progress);
    if (!dir.ok()) return dir.status();
    sum.last_checkpoint = *dir;
    saved_step = state.step;
    log(absl::StrCat("checkpoint ", *dir));
    return absl::OkStatus();
  };

  // FTD_PHASE_TIMES=1: GPU time of each phase of the step, from CUDA events (no extra syncs), on stderr.
  const bool phase_times = device.is_cuda() && std::getenv("FTD_PHASE_TIMES") != nullptr;
  std::vector<at::cuda::CUDAEvent> events;
  for (int i = 0; phase_times && i < 4; ++i) events.emplace_back(cudaEventDefault);
  auto mark = [&](size_t i) {
    if (phase_times) events[i].record();
  };
  // NVML: energy over whole steps (its counter is too coarse for one short step).
  std::unique_ptr<GpuMonitor> gpu;
  if (device.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device.index());
    gpu = GpuMonitor::Open(absl::StrFormat("%04x:%02x:%02x.0", props->pciDomainID, props->pciBusID, props->pciDeviceID));
  } else {
    gpu = GpuMonitor::Unavailable("a CPU run");
  }
  if (!gpu->available()) log(absl::StrCat("GPU power and energy unavailable: ", gpu->reason()));
  EnergyWindow energy;
  auto now_s = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  if (gpu->available()) energy.Start(now_s(), gpu->Read().energy_j, state.tokens_total, state.step);
  StepProfiler profiler(device.is_cuda());
  const int64_t profile_from = cfg.profile.enabled ? cfg.profile.warmup_steps : -1;
  std::chrono::steady_clock::time_point profile_t0;
  for (int64_t step = state.step; step < cfg.steps; ++step) {
    if (step == profile_from) {
      if (device.is_cuda()) torch::cuda::synchronize(device.index());
      log(absl::StrCat("profiling steps ", step + 1, " to ", cfg.steps));
      profiler.Start();
      profile_t0 = std::chrono::steady_clock::now();
    }
    if (hooks.stop != nullptr && hooks.stop->load()) {
      if (hooks.skip_checkpoint != nullptr && hooks.skip_checkpoint->load()) {
        return fail(Outcome::kCancelled, absl::StrCat("stopped on request after step ", state.step,
                                                      ", without a checkpoint"));
      }
      if (auto s = checkpoint(); !s.ok()) return fail(Outcome::kFailed, std::string(s.message()));
      return fail(Outcome::kCancelled, absl::StrCat("stopped on request after step ", state.step));
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    // Fetch every micro-batch first: the loss is normalised by the step's non-ignored tokens.
    std::vector<DeviceBatch> batches;
    int64_t real_tokens = 0, loss_tokens = 0;
    for (int32_t a = 0; a < cfg.grad_accum_steps; ++a) {
      data.Batch(state.micro_batches + a, &host);
      real_tokens += host.real_tokens;
      loss_tokens += host.loss_tokens;
      batches.push_back(upload(host));
    }
    mark(0);
    // The step's unmasked labels, counted on the host as the batches were built.
    torch::Tensor count = torch::full({}, static_cast<double>(std::max<int64_t>(loss_tokens, 1)),
                                      torch::TensorOptions().dtype(torch::kFloat).device(device));
    torch::Tensor loss_acc = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    for (auto& b : batches) {
      torch::Tensor loss;
      {
        RECORD_USER_SCOPE(kPhaseForward);
        loss = model.LossMean(b.ids, b.labels, count, b.layout);
      }
      {
        RECORD_USER_SCOPE(kPhaseBackward);
        loss.backward();
      }
      loss_acc += loss.detach();
    }
    mark(1);
    at::RecordFunction optimizer_scope(at::RecordScope::USER_SCOPE);
    if (optimizer_scope.isActive()) optimizer_scope.before(kPhaseOptimizer);
    auto norm = opt.GradNorm();
    // The finite check runs on the device: a non-finite loss or norm skips the update inside the
    // fused kernel (found_inf), so the host synchronises once per step, after the optimizer's
    // kernels are queued, rather than between backward and the update.
    auto found_inf = torch::logical_not(torch::isfinite(loss_acc).logical_and(torch::isfinite(norm))).to(torch::kFloat);
    if (cfg.optimizer.grad_clip > 0) opt.Clip(norm, cfg.optimizer.grad_clip);
    const double lr = LearningRate(cfg.optimizer, cfg.schedule, step, cfg.steps);
    mark(2);
    opt.Step(lr, found_inf);
    opt.ZeroGrad();
    optimizer_scope.end();
    mark(3);
    auto both = torch::stack({loss_acc, norm}).to(torch::kCPU);
    const double loss_v = both[0].item<double>(), norm_v = both[1].item<double>();
    if (!std::isfinite(loss_v) || !std::isfinite(norm_v)) {
      sum.final_loss = loss_v;
      if (auto s = checkpoint(); !s.ok()) return fail(Outcome::kFailed, std::string(s.message()));
      return fail(Outcome::kNonFinite, absl::StrCat("non-finite ", std::isfinite(loss_v) ? "gradient norm" : "loss",
                                                    " at step ", step + 1, " (loss ", loss_v, ", grad norm ", norm_v,
                                                    "); the update was skipped (lower optimizer.lr or use grad_clip)"));
    }
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (phase_times) {
      log(absl::StrFormat("phases step %d: forward+backward %.2f ms, norm+clip %.2f ms, optimizer %.2f ms, wall %.2f ms",
                          step + 1, events[0].elapsed_time(events[1]), events[1].elapsed_time(events[2]),
                          events[2].elapsed_time(events[3]), dt * 1e3));
    }

    state.step = step + 1;
    state.micro_batches += cfg.grad_accum_steps;
    state.tokens_total += tokens_per_step;
    sum.steps_done = state.step;
    sum.final_loss = loss_v;

    StepMetrics m;
    m.step = state.step;
    m.total_steps = cfg.steps;
    m.loss = loss_v;
    m.grad_norm = norm_v;
    m.lr = lr;
    m.tokens = tokens_per_step;
    m.tokens_total = state.tokens_total;
    m.step_time_s = dt;
    m.tokens_per_s = static_cast<double>(tokens_per_step) / dt;
    m.real_tokens = real_tokens;
    m.loss_tokens = loss_tokens;
    if (eval_data &&
        ((cfg.data.eval_every_steps > 0 && state.step % cfg.data.eval_every_steps == 0) || state.step == cfg.steps)) {
      m.eval_loss = evaluate();
      sum.final_eval_loss = m.eval_loss;
    }
    if (device.is_cuda()) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
      const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      m.peak_mem_allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes[agg].peak);
      m.peak_mem_reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes[agg].peak);
    }
    m.peak_rss_bytes = PeakRss();
    m.mfu = peak > 0 ? flops_per_token * m.tokens_per_s / peak : 0.0;
    if (gpu->available()) {
      const auto sample = gpu->Read();
      if (sample.ok) {
        energy.AddStep(now_s(), sample.energy_j, state.tokens_total, state.step);
        const auto es = energy.Current();
        m.nvml_available = true;
        m.energy_total_j = es.energy_total_j;
        m.step_energy_j = es.step_energy_j;
        m.joules_per_token = es.joules_per_token;
        m.power_w = es.power_w;
        m.gpu_utilization = sample.utilization;
        m.gpu_memory_used_bytes = sample.memory_used_bytes;
      }
    }
    if (hooks.on_step_done) hooks.on_step_done(state.step);
    if (hooks.on_step && (state.step % cfg.log_every == 0 || state.step == cfg.steps || m.eval_loss)) hooks.on_step(m);
    if (profile_from >= 0 && state.step == cfg.steps) {
      const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - profile_t0).count();
      const int profiled = static_cast<int>(cfg.steps - profile_from);
      auto summary = profiler.Stop(profiled, wall_ms / profiled, cfg.profile.trace_path);
      log(absl::StrFormat("profile: %d steps, %.1f ms device time per step (%s), %d ops", profiled,
                          summary.step_device_ms, summary.device, summary.ops.size()));
      if (hooks.on_profile) hooks.on_profile(summary);
    }

    if (cfg.checkpoint.every_steps > 0 && state.step % cfg.checkpoint.every_steps == 0 && state.step < cfg.steps) {
      if (auto s = checkpoint(); !s.ok()) return fail(Outcome::kFailed, std::string(s.message()));
    }
  }
  if (auto s = checkpoint(); !s.ok()) return fail(Outcome::kFailed, std::string(s.message()));
  sum.outcome = Outcome::kSucceeded;
  sum.message = absl::StrCat("trained ", state.step, " steps");
  return sum;
}

}  // namespace

RunSummary RunTraining(const TrainConfig& config, const RunHooks& hooks) {
  // A profiling run: warm-up and profiled steps only, nothing resumed or checkpointed.
  TrainConfig cfg = config;
  if (cfg.profile.enabled) {
    cfg.steps = cfg.profile.warmup_steps + cfg.profile.steps;
    cfg.checkpoint.dir.clear();
  }
  if (auto s = cfg.Validate(); !s.ok()) {
    RunSummary sum;
    sum.outcome = Outcome::kInvalidSpec;
    sum.message = std::string(s.message());
    return sum;
  }
  try {
    return Run(cfg, hooks);
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
