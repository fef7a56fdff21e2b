#include "server/jobs/metrics.h"

#include <algorithm>
#include <cctype>

#include "server/policy/exit_classification.h"
#include "server/store/store.h"

namespace ftd::server {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

const char* StateLabel(ftd::v1::JobState s) {
  switch (s) {
    case ftd::v1::QUEUED: return "queued";
    case ftd::v1::RUNNING: return "running";
    case ftd::v1::SUCCEEDED: return "succeeded";
    case ftd::v1::FAILED: return "failed";
    case ftd::v1::CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

namespace {

std::string Lower(std::string_view v) {
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const char* KindLabel(ftd::v1::JobKind k) { return k == ftd::v1::PROFILE ? "profile" : "finetune"; }

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  jobs_ = &BuildGauge().Name("ftd_jobs").Help("Jobs in the store by state").Register(r);
  submissions_ = &BuildCounter().Name("ftd_job_submissions_total").Help("Jobs accepted by SubmitJob (new jobs only)").Register(r);
  completions_ = &BuildCounter().Name("ftd_job_completions_total").Help("Jobs that reached a terminal state, by state and outcome reason").Register(r);
  retries_ = &BuildCounter().Name("ftd_job_retries_total").Help("Attempts requeued after an infrastructure failure, by reason").Register(r);
  queue_wait_ = &BuildHistogram().Name("ftd_job_queue_wait_seconds").Help("Time from submission (or retry) to a worker starting").Register(r);
  run_duration_ = &BuildHistogram().Name("ftd_job_run_duration_seconds").Help("Wall time of the last attempt of finished jobs").Register(r);
  tokens_per_s_ = &BuildGauge().Name("ftd_worker_tokens_per_second").Help("Training throughput of the last step on the slot").Register(r);
  step_time_ = &BuildGauge().Name("ftd_worker_step_time_seconds").Help("Wall time of the last optimizer step on the slot").Register(r);
  peak_mem_ = &BuildGauge().Name("ftd_worker_peak_memory_bytes").Help("Peak memory during the last step on the slot (GPU allocated/reserved, host rss)").Register(r);
  loss_ = &BuildGauge().Name("ftd_worker_loss").Help("Training loss of the last step on the slot").Register(r);
  eval_loss_ = &BuildGauge().Name("ftd_worker_eval_loss").Help("Mean masked loss on the held-out data at the last evaluation on the slot").Register(r);
  mfu_ = &BuildGauge().Name("ftd_worker_mfu_ratio").Help("Model FLOPs utilisation of the last step on the slot (0..1)").Register(r);
  tokens_ = &BuildCounter().Name("ftd_worker_tokens_total").Help("Tokens trained on the slot").Register(r);
  steps_ = &BuildCounter().Name("ftd_worker_steps_total").Help("Optimizer steps completed on the slot").Register(r);
  energy_ = &BuildCounter().Name("ftd_worker_energy_joules_total").Help("GPU energy used while training on the slot (NVML)").Register(r);
  power_ = &BuildGauge().Name("ftd_worker_power_watts").Help("Mean GPU power over the last reported steps (NVML)").Register(r);
  joules_per_token_ = &BuildGauge().Name("ftd_worker_joules_per_token").Help("GPU energy per trained token over the last reported steps (NVML)").Register(r);
  utilization_ = &BuildGauge().Name("ftd_worker_gpu_utilization_ratio").Help("NVML GPU utilisation sample at the last step (0..1)").Register(r);
  gpu_memory_used_ = &BuildGauge().Name("ftd_worker_gpu_memory_used_bytes").Help("NVML memory used on the slot's GPU at the last step").Register(r);
  profile_seconds_ = &BuildGauge().Name("ftd_profile_device_seconds_per_step").Help("Device time per training step by op category, from the last PROFILE job of the kernel set").Register(r);
  profile_step_seconds_ = &BuildGauge().Name("ftd_profile_step_device_seconds").Help("Device time per training step, from the last PROFILE job of the kernel set").Register(r);
  store_write_failures_ = &BuildCounter().Name("ftd_store_write_failures_total").Help("Writes the job store refused (full disk, I/O error), by what was written").Register(r);
  unrecorded_ = &BuildGauge().Name("ftd_unrecorded_outcomes").Help("Ended attempts whose outcome ftd keeps in memory until the store takes it").Register(r);
  gpu_jobs_ = &BuildGauge().Name("ftd_gpu_jobs").Help("Jobs running on the GPU (more than one: they share it)").Register(r);
  gpu_predicted_ = &BuildGauge().Name("ftd_gpu_predicted_bytes").Help("Sum of the predicted peak memory of the jobs running on the GPU").Register(r);
  for (const char* w : {"submit", "state", "event", "usage"}) store_write_failures_->Add({{"write", w}});
  unrecorded_->Add({}).Set(0);
  // Every series of the closed label sets exists from the start at 0, so rate() and increase() see
  // a job's first failure (a series born at 1 has no increase to see).
  for (const char* kind : {"finetune", "profile"}) submissions_->Add({{"kind", kind}});
  for (const ReasonInfo& r : kReasons) {
    if (IsTerminal(r.final_state)) completions_->Add({{"state", StateLabel(r.final_state)}, {"outcome", Lower(r.code)}});
    if (r.retry == Retry::kWhileAttemptsLeft) retries_->Add({{"reason", Lower(r.code)}});
  }
}

StepTotals::Delta StepTotals::Advance(const ftd::v1::StepReport& r) {
  Delta d;
  d.steps = std::max<int64_t>(0, r.step() - step);
  d.tokens = std::max<int64_t>(0, r.tokens_total() - tokens);
  step = std::max(step, r.step());
  tokens = std::max(tokens, r.tokens_total());
  if (r.nvml_available()) {
    d.energy_j = std::max(0.0, r.energy_total_j() - energy_j);
    energy_j = std::max(energy_j, r.energy_total_j());
  }
  return d;
}

void Metrics::JobSubmitted(ftd::v1::JobKind kind) { submissions_->Add({{"kind", KindLabel(kind)}}).Increment(); }

void Metrics::JobsByState(const std::map<ftd::v1::JobState, int64_t>& counts) {
  for (auto s : {ftd::v1::QUEUED, ftd::v1::RUNNING, ftd::v1::SUCCEEDED, ftd::v1::FAILED, ftd::v1::CANCELLED}) {
    auto it = counts.find(s);
    jobs_->Add({{"state", StateLabel(s)}}).Set(it == counts.end() ? 0.0 : static_cast<double>(it->second));
  }
}

namespace {
const prometheus::Histogram::BucketBoundaries& DurationBuckets() {
  static const prometheus::Histogram::BucketBoundaries b = {0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600};
  return b;
}
}  // namespace

void Metrics::QueueWait(double seconds) { queue_wait_->Add({}, DurationBuckets()).Observe(seconds); }

void Metrics::JobFinished(ftd::v1::JobState state, std::string_view outcome, double run_seconds) {
  completions_->Add({{"state", StateLabel(state)}, {"outcome", Lower(outcome)}}).Increment();
  run_duration_->Add({{"state", StateLabel(state)}}, DurationBuckets()).Observe(run_seconds);
}

void Metrics::Retry(std::string_view reason) { retries_->Add({{"reason", Lower(reason)}}).Increment(); }

void Metrics::Profile(ftd::spec::KernelSet kernel_set, const ftd::v1::ProfileReport& p) {
  const std::string ks = ftd::spec::KernelSetName(kernel_set);
  for (const auto& c : p.categories()) {
    profile_seconds_->Add({{"category", c.category()}, {"kernel_set", ks}}).Set(c.device_ms() / 1e3);
  }
  profile_step_seconds_->Add({{"kernel_set", ks}}).Set(p.step_device_ms() / 1e3);
}

void Metrics::Step(const std::string& slot, ftd::spec::KernelSet kernel_set, const ftd::v1::StepReport& r,
                   const StepTotals::Delta& delta) {
  const std::map<std::string, std::string> l = {{"slot", slot}, {"kernel_set", ftd::spec::KernelSetName(kernel_set)}};
  tokens_per_s_->Add(l).Set(r.tokens_per_s());
  step_time_->Add(l).Set(r.step_time_s());
  loss_->Add(l).Set(r.loss());
  if (r.has_eval_loss()) eval_loss_->Add(l).Set(r.eval_loss());
  mfu_->Add(l).Set(r.mfu());
  tokens_->Add(l).Increment(static_cast<double>(delta.tokens));
  steps_->Add(l).Increment(static_cast<double>(delta.steps));
  // The CPU slot has no GPU memory to report: its series would only ever read 0.
  if (slot != kCpuSlot) {
    peak_mem_->Add({{"slot", slot}, {"kind", "gpu_allocated"}}).Set(static_cast<double>(r.peak_mem_allocated_bytes()));
    peak_mem_->Add({{"slot", slot}, {"kind", "gpu_reserved"}}).Set(static_cast<double>(r.peak_mem_reserved_bytes()));
  }
  peak_mem_->Add({{"slot", slot}, {"kind", "host_rss"}}).Set(static_cast<double>(r.peak_rss_bytes()));
  if (r.nvml_available()) {
    energy_->Add(l).Increment(delta.energy_j);
    power_->Add({{"slot", slot}}).Set(r.power_w());
    joules_per_token_->Add(l).Set(r.joules_per_token());
    utilization_->Add({{"slot", slot}}).Set(r.gpu_utilization());
    gpu_memory_used_->Add({{"slot", slot}}).Set(static_cast<double>(r.gpu_memory_used_bytes()));
  }
}

void Metrics::StoreWriteFailed(std::string_view write) {
  store_write_failures_->Add({{"write", std::string(write)}}).Increment();
}

void Metrics::GpuShare(int gpu, int jobs, int64_t predicted_bytes) {
  const std::map<std::string, std::string> l = {{"gpu", std::to_string(gpu)}};
  gpu_jobs_->Add(l).Set(jobs);
  gpu_predicted_->Add(l).Set(static_cast<double>(predicted_bytes));
}

void Metrics::UnrecordedOutcomes(int64_t n) { unrecorded_->Add({}).Set(static_cast<double>(n)); }

namespace {
void RemoveSeries(prometheus::Family<prometheus::Gauge>* f, const prometheus::Labels& l) {
  if (f->Has(l)) f->Remove(&f->Add(l));
}
}  // namespace

// The last job's loss, step time, memory, power... would otherwise stay on the slot's series and
// draw a flat line for an idle GPU: they are removed (a gap on a dashboard), and tokens/s reads 0.
// Counters stay: they count what the slot did.
void Metrics::SlotIdle(const std::string& slot) {
  for (const char* ks : ftd::spec::kKernelSetNames) {
    const prometheus::Labels l = {{"slot", slot}, {"kernel_set", ks}};
    tokens_per_s_->Add(l).Set(0);
    for (auto* f : {step_time_, loss_, eval_loss_, mfu_, joules_per_token_}) RemoveSeries(f, l);
  }
  for (const char* kind : {"gpu_allocated", "gpu_reserved", "host_rss"}) RemoveSeries(peak_mem_, {{"slot", slot}, {"kind", kind}});
  for (auto* f : {power_, utilization_, gpu_memory_used_}) RemoveSeries(f, {{"slot", slot}});
}

}  // namespace ftd::server
