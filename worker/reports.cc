#include "worker/reports.h"

namespace ftd::worker {

ftd::v1::StepReport ToStepReport(const engine::StepMetrics& m) {
  ftd::v1::StepReport r;
  r.set_step(m.step);
  r.set_total_steps(m.total_steps);
  r.set_loss(m.loss);
  r.set_grad_norm(m.grad_norm);
  r.set_lr(m.lr);
  r.set_tokens(m.tokens);
  r.set_tokens_total(m.tokens_total);
  r.set_step_time_s(m.step_time_s);
  r.set_tokens_per_s(m.tokens_per_s);
  r.set_peak_mem_allocated_bytes(m.peak_mem_allocated_bytes);
  r.set_peak_mem_reserved_bytes(m.peak_mem_reserved_bytes);
  r.set_peak_rss_bytes(m.peak_rss_bytes);
  r.set_mfu(m.mfu);
  r.set_nvml_available(m.nvml_available);
  r.set_energy_total_j(m.energy_total_j);
  r.set_step_energy_j(m.step_energy_j);
  r.set_joules_per_token(m.joules_per_token);
  r.set_power_w(m.power_w);
  r.set_gpu_utilization(m.gpu_utilization);
  r.set_gpu_memory_used_bytes(m.gpu_memory_used_bytes);
  r.set_real_tokens(m.real_tokens);
  r.set_loss_tokens(m.loss_tokens);
  if (m.eval_loss) r.set_eval_loss(*m.eval_loss);
  return r;
}

ftd::v1::ProfileReport ToProfileReport(const engine::ProfileSummary& p, const std::string& kernel_set) {
  ftd::v1::ProfileReport r;
  r.set_device(p.device);
  r.set_steps(p.steps);
  r.set_step_wall_ms(p.step_wall_ms);
  r.set_step_device_ms(p.step_device_ms);
  for (const auto& o : p.ops) {
    auto* x = r.add_ops();
    x->set_name(o.name);
    x->set_phase(o.phase);
    x->set_category(o.category);
    x->set_device_ms(o.device_ms);
    x->set_share(o.share);
    x->set_calls(o.calls);
    x->set_host_ms(o.host_ms);
  }
  for (const auto& [c, ms] : p.category_ms) {
    auto* x = r.add_categories();
    x->set_category(c);
    x->set_device_ms(ms);
  }
  r.set_trace_bytes(static_cast<int64_t>(p.trace_bytes));
  r.set_kernel_set(kernel_set);
  return r;
}

ftd::v1::RunResult ToRunResult(const engine::RunSummary& s) {
  ftd::v1::RunResult r;
  switch (s.outcome) {
    case engine::Outcome::kSucceeded: r.set_outcome(ftd::v1::RunResult::SUCCEEDED); break;
    case engine::Outcome::kNonFinite: r.set_outcome(ftd::v1::RunResult::NON_FINITE); break;
    case engine::Outcome::kOutOfMemory: r.set_outcome(ftd::v1::RunResult::OUT_OF_MEMORY); break;
    case engine::Outcome::kInvalidSpec: r.set_outcome(ftd::v1::RunResult::INVALID_SPEC); break;
    case engine::Outcome::kFailed: r.set_outcome(ftd::v1::RunResult::FAILED); break;
    case engine::Outcome::kCancelled: r.set_outcome(ftd::v1::RunResult::CANCELLED); break;
  }
  r.set_message(s.message);
  r.set_steps_done(s.steps_done);
  r.set_final_loss(s.final_loss);
  r.set_last_checkpoint(s.last_checkpoint);
  if (s.final_eval_loss) r.set_final_eval_loss(*s.final_eval_loss);
  return r;
}

}  // namespace ftd::worker
