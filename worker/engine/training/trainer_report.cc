// What a training run reports after each step: the step's metrics (loss, throughput, memory peaks,
// MFU, energy from NVML), the held-out loss when it is due, and at the end of a profiling run the
// profile and its trace.
#include "worker/engine/training/training_run.h"

#include <sys/resource.h>

#include <algorithm>

#include <c10/cuda/CUDACachingAllocator.h>

#include "absl/strings/str_format.h"

namespace ftd::engine {

namespace {

uint64_t PeakRss() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

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
  // The job's throughput against the peak of every GPU it runs on (one per rank).
  m.mfu = peak_flops_ > 0 ? flops_per_token_ * m.tokens_per_s / (peak_flops_ * world_) : 0.0;
  // Energy of every GPU of the job (ShareRankStats) over the tokens of every rank.
  if (energy_started_ && job_gpu_.ok) {
    energy_.AddStep(job_gpu_t_, job_gpu_.energy_j, state_.tokens_total, state_.step);
    const auto es = energy_.Current();
    m.nvml_available = true;
    m.energy_total_j = es.energy_total_j;
    m.step_energy_j = es.step_energy_j;
    m.joules_per_token = es.joules_per_token;
    m.power_w = es.power_w;
    m.gpu_utilization = job_gpu_.utilization;
    m.gpu_memory_used_bytes = job_gpu_.memory_used_bytes;
  }
  // The one ETA (ftctl get and watch show it): the steps left at a moving average of the step time.
  step_time_ewma_ = step_time_ewma_ < 0 ? dt : kEtaWeight * dt + (1 - kEtaWeight) * step_time_ewma_;
  m.eta_s = static_cast<double>(std::max<int64_t>(0, cfg_.steps - state_.step)) * step_time_ewma_;
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

}  // namespace ftd::engine
