// The training loop. Step order (fixed): fetch -> forward/backward per micro-batch (accumulate)
// -> grad norm -> finite check on loss and grad norm (on the device) -> clip -> AdamW step
// (skipped when the check failed) -> report -> checkpoint. A failed finite check stops the run
// after checkpointing the last good state. With spec.optimizer.overlap the norm, the finite check
// and the update run group by group inside the last micro-batch's backward (optimizer.h).
// This file holds the run's frame and its step; the other parts are listed in training_run.h.
#include "worker/engine/training/training_run.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <ATen/record_function.h>
#include <torch/cuda.h>

#include "absl/strings/str_format.h"

namespace ftd::engine {

namespace {

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

}  // namespace

RunSummary TrainingRun::Run() {
  if (!Setup()) return sum_;
  const int64_t resumed_at = state_.step;  // 0 unless resumed from a checkpoint
  for (int64_t step = state_.step; step < cfg_.steps; ++step) {
    if (!Step(step)) return sum_;
  }
  if (!Checkpoint()) return sum_;
  sum_.outcome = Outcome::kSucceeded;
  if (state_.step == resumed_at && resumed_at > 0) {
    // The spec run again after it finished: say so, rather than count steps it did not run.
    sum_.message = absl::StrCat(
        "already at step ", state_.step,
        state_.step == cfg_.steps ? absl::StrCat(" of ", cfg_.steps) : absl::StrCat(", past spec.steps ", cfg_.steps),
        " in ", sum_.last_checkpoint,
        "; nothing to train (raise spec.steps to train on, or give a new checkpoint.dir to train afresh)");
  } else if (resumed_at > 0) {
    sum_.message = absl::StrCat("trained ", state_.step - resumed_at, " steps (", resumed_at + 1, " to ", state_.step,
                                ", resumed from step ", resumed_at, ")");
  } else {
    sum_.message = absl::StrCat("trained ", state_.step, " steps");
  }
  return sum_;
}

TrainingRun::DeviceBatch TrainingRun::Upload(MicroBatch& mb) const {
  auto as_tensor = [&](std::vector<int64_t>& v) {
    return torch::from_blob(v.data(), {mb.rows, mb.seq}, torch::kInt64).clone().to(device_);
  };
  DeviceBatch d{as_tensor(mb.input_ids), as_tensor(mb.labels), {}};
  if (mb.multi_document) d.layout = PackedLayout::FromSegments(as_tensor(mb.positions), as_tensor(mb.segments));
  return d;
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
  // The GPUs' energy counters at the step's end: this rank's, and with several ranks all of theirs.
  const GpuMonitor::Sample own_gpu = gpu_->available() ? gpu_->Read() : GpuMonitor::Sample{};
  job_gpu_t_ = NowS();
  if (world_ > 1) {
    ShareRankStats(own_gpu);
  } else {
    job_gpu_ = own_gpu;
  }
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
