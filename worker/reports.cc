#include "worker/reports.h"

namespace ftd::worker {

ftd::v1::RunResult::Outcome ToProto(spec::Outcome o) {
  ftd::v1::RunResult::Outcome p = ftd::v1::RunResult::FAILED;
  const bool known = ftd::v1::RunResult::Outcome_Parse(std::string(spec::OutcomeName(o)), &p);
  return known ? p : ftd::v1::RunResult::FAILED;  // reports_test: every outcome has its value
}

ftd::v1::StepReport ToStepReport(const engine::StepMetrics& m) {
  ftd::v1::StepReport r;
#define FTD_STEP_METRICS_SET(type, name, meaning) \
  if (const auto v = engine::MetricValue(m.name)) r.set_##name(*v);
  FTD_STEP_METRICS(FTD_STEP_METRICS_SET)
#undef FTD_STEP_METRICS_SET
  return r;
}

ftd::v1::ProfileReport ToProfileReport(const engine::ProfileSummary& p, spec::KernelSet kernel_set) {
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
  r.set_kernel_set(spec::KernelSetName(kernel_set));
  return r;
}

ftd::v1::RunResult ToRunResult(const engine::RunSummary& s) {
  ftd::v1::RunResult r;
  r.set_outcome(ToProto(s.outcome));
  r.set_message(s.message);
  r.set_steps_done(s.steps_done);
  r.set_final_loss(s.final_loss);
  r.set_last_checkpoint(s.last_checkpoint);
  if (s.final_eval_loss) r.set_final_eval_loss(*s.final_eval_loss);
  return r;
}

}  // namespace ftd::worker
