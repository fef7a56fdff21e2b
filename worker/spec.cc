#include "worker/spec.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace ftd::worker {

absl::StatusOr<ftd::v1::TrainSpec> ParseTrainSpecJson(const std::string& json) {
  ftd::v1::TrainSpec spec;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  auto st = google::protobuf::util::JsonStringToMessage(json, &spec, opts);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec is not a valid TrainSpec JSON: ", st.message().as_string(),
                                                   " (docs/job-spec.md lists every field)"));
  }
  return spec;
}

std::string TrainSpecToJson(const ftd::v1::TrainSpec& spec) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &out, opts);
  return out;
}

absl::Status ApplySetOverride(const std::string& assignment, ftd::v1::TrainSpec* spec) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set takes field=value, e.g. --set optimizer.lr=1e-4 (got \"", assignment, "\")"));
  }
  nlohmann::json patch = nlohmann::json::object();
  nlohmann::json* node = &patch;
  std::string path = assignment.substr(0, eq);
  for (size_t dot; (dot = path.find('.')) != std::string::npos; path = path.substr(dot + 1)) {
    node = &(*node)[path.substr(0, dot)];
  }
  const std::string value = assignment.substr(eq + 1);
  nlohmann::json v = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  (*node)[path] = v.is_discarded() ? nlohmann::json(value) : v;
  auto parsed = ParseTrainSpecJson(patch.dump());
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": ", parsed.status().message()));
  spec->MergeFrom(*parsed);
  return absl::OkStatus();
}

absl::StatusOr<engine::TrainConfig> ToTrainConfig(const ftd::v1::TrainSpec& s) {
  engine::TrainConfig c;
  const auto& m = s.model();
  if (m.has_preset()) c.model.preset = m.preset();
  if (m.has_config_path()) c.model.config_path = m.config_path();
  if (m.has_weights_path()) c.model.weights_path = m.weights_path();
  const auto& d = s.data();
  if (d.has_path()) c.data.path = d.path();
  if (d.has_token_dtype()) c.data.token_dtype = d.token_dtype();
  if (d.has_shuffle()) c.data.shuffle = d.shuffle();
  if (d.has_seed()) c.data.seed = d.seed();
  const auto& o = s.optimizer();
  if (o.has_lr()) c.optimizer.lr = o.lr();
  if (o.has_beta1()) c.optimizer.beta1 = o.beta1();
  if (o.has_beta2()) c.optimizer.beta2 = o.beta2();
  if (o.has_eps()) c.optimizer.eps = o.eps();
  if (o.has_weight_decay()) c.optimizer.weight_decay = o.weight_decay();
  if (o.has_grad_clip()) c.optimizer.grad_clip = o.grad_clip();
  const auto& sc = s.schedule();
  if (sc.has_kind()) c.schedule.kind = sc.kind();
  if (sc.has_warmup_steps()) c.schedule.warmup_steps = sc.warmup_steps();
  if (sc.has_min_lr_ratio()) c.schedule.min_lr_ratio = sc.min_lr_ratio();
  const auto& ck = s.checkpoint();
  if (ck.has_dir()) c.checkpoint.dir = ck.dir();
  if (ck.has_every_steps()) c.checkpoint.every_steps = ck.every_steps();
  if (ck.has_resume()) c.checkpoint.resume = ck.resume();
  if (ck.has_keep_last()) c.checkpoint.keep_last = ck.keep_last();
  if (ck.has_enabled() && !ck.enabled()) c.checkpoint.dir.clear();
  if (s.has_steps()) c.steps = s.steps();
  if (s.has_batch_size()) c.batch_size = s.batch_size();
  if (s.has_seq_len()) c.seq_len = s.seq_len();
  if (s.has_grad_accum_steps()) c.grad_accum_steps = s.grad_accum_steps();
  if (s.has_device()) c.device = s.device();
  if (s.has_dtype()) c.dtype = s.dtype();
  if (s.has_fp32_master_weights()) c.fp32_master_weights = s.fp32_master_weights();
  if (s.has_seed()) c.seed = s.seed();
  if (s.has_log_every()) c.log_every = s.log_every();
  if (s.has_kernel_set()) c.kernel_set = s.kernel_set();
  for (const auto& [op, impl] : s.kernels()) c.kernels[op] = impl;
  if (s.profile().has_warmup_steps()) c.profile.warmup_steps = s.profile().warmup_steps();
  if (s.profile().has_steps()) c.profile.steps = s.profile().steps();
  if (s.has_peak_flops()) c.peak_flops = s.peak_flops();
  if (auto st = c.Validate(); !st.ok()) return st;
  return c;
}

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

std::string ProfileTable(const ftd::v1::ProfileReport& p, int top) {
  const char* what = p.device() == "cpu" ? "self CPU" : "self device";
  std::string out = absl::StrFormat(
      "profile: %d step(s), %.1f ms wall and %.1f ms %s time per step, kernel set %s\n\n", p.steps(),
      p.step_wall_ms(), p.step_device_ms(), p.device() == "cpu" ? "CPU" : "device", p.kernel_set());
  absl::StrAppendFormat(&out, "%-52s %-9s %-13s %12s %7s %8s %10s\n", "op", "phase", "category",
                        absl::StrCat(what, " ms"), "share", "calls", "host ms");
  int n = 0;
  for (const auto& o : p.ops()) {
    if (top > 0 && n++ >= top) break;
    std::string name = o.name().size() > 52 ? o.name().substr(0, 49) + "..." : o.name();
    absl::StrAppendFormat(&out, "%-52s %-9s %-13s %12.3f %6.1f%% %8.1f %10.3f\n", name, o.phase(), o.category(),
                          o.device_ms(), 100 * o.share(), o.calls(), o.host_ms());
  }
  absl::StrAppend(&out, "\nby category (ms per step):");
  for (const auto& c : p.categories()) {
    if (c.device_ms() > 0) absl::StrAppendFormat(&out, "  %s %.3f", c.category(), c.device_ms());
  }
  return out + "\n";
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
  return r;
}

ftd::v1::TrainSpec DefaultTrainSpec(bool gpu) {
  ftd::v1::TrainSpec s;
  if (gpu) {
    // The LLaMA-3.1-8B shape, random init, bf16 weights and AdamW state, at 4 x 2048 tokens, on
    // ftd's fused kernels.
    s.mutable_model()->set_preset("llama-3.1-8b");
    s.set_kernel_set("fused");
    s.set_batch_size(4);
    s.set_seq_len(2048);
    s.set_steps(30);
    s.mutable_optimizer()->set_lr(3e-5);
    s.mutable_optimizer()->set_weight_decay(0.0);
  } else {
    // The tiny LLaMA learning the embedded arithmetic language; the loss falls from ~4.2 (uniform
    // over 64 ids) to about 1.5 in 300 steps (about 40 s on two cores).
    s.mutable_model()->set_preset("tiny");
    s.set_batch_size(16);
    s.set_seq_len(64);
    s.set_steps(300);
    s.mutable_optimizer()->set_lr(3e-3);
    s.mutable_optimizer()->set_weight_decay(0.01);
    s.mutable_schedule()->set_kind("cosine");
    s.mutable_schedule()->set_warmup_steps(20);
    s.set_log_every(10);
  }
  return s;
}

}  // namespace ftd::worker
