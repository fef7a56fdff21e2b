// Every Prometheus family ftd exports, built in one place (docs/metrics.md is the catalog). Labels
// come only from closed sets: job state, kind, outcome/reason codes, slot ("gpu:N" or "cpu") and
// kernel set. No job ids or user names.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "ftd/v1/jobs.pb.h"
#include "spec/train_config.h"

namespace ftd::server {

// The slot label of a daemon without GPUs (the others are "gpu:N").
inline constexpr const char* kCpuSlot = "cpu";

// What one attempt's step reports have added to the step, token and energy counters so far. A report
// may cover several steps (log_every); a resumed attempt starts from the job's last report.
struct StepTotals {
  struct Delta {
    int64_t steps = 0, tokens = 0;
    double energy_j = 0;
  };
  int64_t step = 0, tokens = 0;
  double energy_j = 0;  // the worker's energy_total_j already counted
  // The counters' increments for this report; never negative.
  Delta Advance(const ftd::v1::StepReport& r);
};

class Metrics {
 public:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void JobSubmitted(ftd::v1::JobKind kind);
  void JobsByState(const std::map<ftd::v1::JobState, int64_t>& counts);
  void QueueWait(double seconds);
  // A job reached a terminal state; outcome is its reason code (SUCCEEDED, GPU_OUT_OF_MEMORY, ...: the
  // codes of exit_classification.h, whose table also fixes the label sets).
  void JobFinished(ftd::v1::JobState state, std::string_view outcome, double run_seconds);
  void Retry(std::string_view reason);
  // A step report; `delta` is what it adds to the counters (StepTotals::Advance).
  void Step(const std::string& slot, ftd::spec::KernelSet kernel_set, const ftd::v1::StepReport& r,
            const StepTotals::Delta& delta);
  // A PROFILE job's result: device seconds per step by op category.
  void Profile(ftd::spec::KernelSet kernel_set, const ftd::v1::ProfileReport& p);
  void SlotIdle(const std::string& slot);
  // A write the store refused (full disk, I/O error): `write` is "submit", "state" (a job's state
  // change, kept in memory and retried) or "event" (a step report or log line, dropped).
  void StoreWriteFailed(std::string_view write);
  // The jobs running on GPU `gpu` and the sum of their predicted peaks (label: the GPU index).
  void GpuShare(int gpu, int jobs, int64_t predicted_bytes);
  // Ended attempts whose outcome ftd keeps in memory because the store refused it.
  void UnrecordedOutcomes(int64_t n);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Family<prometheus::Counter>* submissions_;
  prometheus::Family<prometheus::Counter>* completions_;
  prometheus::Family<prometheus::Counter>* retries_;
  prometheus::Family<prometheus::Histogram>* queue_wait_;
  prometheus::Family<prometheus::Histogram>* run_duration_;
  prometheus::Family<prometheus::Gauge>* tokens_per_s_;
  prometheus::Family<prometheus::Gauge>* step_time_;
  prometheus::Family<prometheus::Gauge>* peak_mem_;
  prometheus::Family<prometheus::Gauge>* loss_;
  prometheus::Family<prometheus::Gauge>* eval_loss_;
  prometheus::Family<prometheus::Gauge>* mfu_;
  prometheus::Family<prometheus::Counter>* tokens_;
  prometheus::Family<prometheus::Counter>* steps_;
  prometheus::Family<prometheus::Counter>* energy_;
  prometheus::Family<prometheus::Gauge>* power_;
  prometheus::Family<prometheus::Gauge>* joules_per_token_;
  prometheus::Family<prometheus::Gauge>* utilization_;
  prometheus::Family<prometheus::Gauge>* gpu_memory_used_;
  prometheus::Family<prometheus::Gauge>* profile_seconds_;
  prometheus::Family<prometheus::Gauge>* profile_step_seconds_;
  prometheus::Family<prometheus::Counter>* store_write_failures_;
  prometheus::Family<prometheus::Gauge>* unrecorded_;
  prometheus::Family<prometheus::Gauge>* gpu_jobs_;
  prometheus::Family<prometheus::Gauge>* gpu_predicted_;
};

const char* StateLabel(ftd::v1::JobState s);

}  // namespace ftd::server
