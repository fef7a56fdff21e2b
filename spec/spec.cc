#include "spec/spec.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "spec/closest_match.h"
#include "spec/message_check.h"
#include "spec/proto_json.h"

namespace ftd::spec {

namespace {

// A JSON syntax error as "line L, column C: what" (protobuf's parser names neither); OK for valid JSON.
absl::Status CheckJsonSyntax(const std::string& json) {
  try {
    const nlohmann::json parsed = nlohmann::json::parse(json);
    (void)parsed;
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann points after the last character it read; step back to the start of that token.
    size_t at = std::min(json.size(), e.byte == 0 ? size_t{0} : e.byte - 1);
    if (at < json.size() && json[at] == '"' && at > 0) {
      do --at; while (at > 0 && !(json[at] == '"' && json[at - 1] != '\\'));
    } else {
      auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+' || c == '-'; };
      while (at > 0 && at < json.size() && word(json[at]) && word(json[at - 1])) --at;
    }
    const size_t line = 1 + static_cast<size_t>(std::count(json.begin(), json.begin() + static_cast<long>(at), '\n'));
    const size_t nl = at == 0 ? std::string::npos : json.rfind('\n', at - 1);
    const size_t column = nl == std::string::npos ? at + 1 : at - nl;
    std::string what = e.what();
    // nlohmann's text: "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..."
    if (const auto p = what.find("syntax error"); p != std::string::npos) what = what.substr(p);
    return absl::InvalidArgumentError(absl::StrCat("spec is not valid JSON: line ", line, ", column ", column, ": ", what));
  } catch (const nlohmann::json::exception& e) {
    // A number outside a double's range (1e400): out_of_range.406, which names the number.
    std::string what = e.what();
    if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    return absl::InvalidArgumentError(absl::StrCat("spec is not valid JSON: ", what));
  }
  return absl::OkStatus();
}

// Every field of `d` and of the messages below it, by path ("optimizer.lr"), for suggestions.
void FieldPaths(const google::protobuf::Descriptor* d, const std::string& prefix, std::vector<std::string>* out,
                int depth = 0) {
  if (depth > 8) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    out->push_back(path);
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE && !f->is_map()) {
      FieldPaths(f->message_type(), path, out, depth + 1);
    }
  }
}

// What was probably meant by the unknown field `key` of the message `d` at `path` ("spec.optimiser"):
// the same name elsewhere in the spec ("lr" -> "optimizer.lr"), else the closest field beside it
// ("batchsize" -> "batch_size", "optimiser" -> "optimizer"), else the closest name anywhere.
std::string SuggestField(const google::protobuf::Descriptor* d, const std::string& key) {
  std::vector<std::string> all;
  FieldPaths(ftd::v1::TrainSpec::descriptor(), "", &all);
  const auto leaf = [](const std::string& p) { return p.substr(p.rfind('.') == std::string::npos ? 0 : p.rfind('.') + 1); };
  std::string snake;  // lowerCamelCase typed: compare as snake_case too
  for (char c : key) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      snake += '_';
      snake += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      snake += c;
    }
  }
  for (const auto& p : all) {
    if (leaf(p) == snake) return p;
  }
  std::vector<std::string> siblings;
  for (int i = 0; i < d->field_count(); ++i) siblings.push_back(d->field(i)->name());
  if (auto m = ClosestMatch(snake, siblings); !m.empty()) return m;
  std::vector<std::string> leaves;
  for (const auto& p : all) leaves.push_back(leaf(p));
  const std::string m = ClosestMatch(snake, leaves);
  if (m.empty()) return "";
  for (const auto& p : all) {
    if (leaf(p) == m) return p;
  }
  return "";
}

// Refuses a key that names no field of the message it is in, saying which field was probably meant
// (protobuf's parser says only "Cannot find field").
absl::Status CheckFieldNames(const nlohmann::json& j, const google::protobuf::Descriptor* d, const std::string& path) {
  if (!j.is_object()) return absl::OkStatus();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(it.key());
    for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
      if (d->field(i)->json_name() == it.key()) f = d->field(i);  // the lowerCamelCase spelling
    }
    const std::string at = absl::StrCat(path, ".", it.key());
    if (f == nullptr) {
      const std::string m = SuggestField(d, it.key());
      return absl::InvalidArgumentError(absl::StrCat(at, " is not a field of the spec",
                                                     m.empty() ? "" : absl::StrCat("; did you mean \"", m, "\"?"),
                                                     " (docs/job-spec.md lists every field)"));
    }
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE || f->is_map()) continue;
    if (f->is_repeated() && it->is_array()) {
      for (const auto& e : *it) {
        if (auto st = CheckFieldNames(e, f->message_type(), at); !st.ok()) return st;
      }
    } else if (auto st = CheckFieldNames(*it, f->message_type(), at); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ftd::v1::TrainSpec> ParseTrainSpecJson(const std::string& json) {
  if (auto st = CheckJsonSyntax(json); !st.ok()) return st;
  if (auto st = CheckFieldNames(nlohmann::json::parse(json), ftd::v1::TrainSpec::descriptor(), "spec"); !st.ok()) {
    return st;
  }
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
  return MessageToJsonValue(spec, /*every_field=*/false).dump(2);  // numbers as numbers: "steps": 300
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
  // A list given with --set replaces the spec's list (MergeFrom would append to it).
  if (parsed->lora().target_modules_size() > 0) spec->mutable_lora()->clear_target_modules();
  spec->MergeFrom(*parsed);
  return absl::OkStatus();
}

absl::StatusOr<TrainConfig> ToTrainConfig(const ftd::v1::TrainSpec& s) {
  TrainConfig c;
  const auto& m = s.model();
  if (m.has_preset()) c.model.preset = m.preset();
  if (m.has_config_path()) c.model.config_path = m.config_path();
  if (m.has_weights_path()) c.model.weights_path = m.weights_path();
  const auto& d = s.data();
  if (d.has_path()) c.data.path = d.path();
  if (d.has_token_dtype()) c.data.token_dtype = d.token_dtype();
  if (d.has_shuffle()) c.data.shuffle = d.shuffle();
  if (d.has_seed()) c.data.seed = d.seed();
  if (d.has_format()) c.data.format = d.format();
  if (d.has_tokenizer_path()) c.data.tokenizer_path = d.tokenizer_path();
  if (d.has_text_field()) c.data.text_field = d.text_field();
  if (d.has_prompt_field()) c.data.prompt_field = d.prompt_field();
  if (d.has_completion_field()) c.data.completion_field = d.completion_field();
  if (d.has_messages_field()) c.data.messages_field = d.messages_field();
  if (d.has_role_field()) c.data.role_field = d.role_field();
  if (d.has_content_field()) c.data.content_field = d.content_field();
  if (d.has_on_bad_line()) c.data.on_bad_line = d.on_bad_line();
  if (d.has_sequence()) c.data.sequence = d.sequence();
  if (d.has_eval_path()) c.data.eval_path = d.eval_path();
  if (d.has_eval_fraction()) c.data.eval_fraction = d.eval_fraction();
  if (d.has_eval_every_steps()) c.data.eval_every_steps = d.eval_every_steps();
  if (d.has_cache_dir()) c.data.cache_dir = d.cache_dir();
  const auto& o = s.optimizer();
  if (o.has_lr()) c.optimizer.lr = o.lr();
  if (o.has_beta1()) c.optimizer.beta1 = o.beta1();
  if (o.has_beta2()) c.optimizer.beta2 = o.beta2();
  if (o.has_eps()) c.optimizer.eps = o.eps();
  if (o.has_weight_decay()) c.optimizer.weight_decay = o.weight_decay();
  if (o.has_grad_clip()) c.optimizer.grad_clip = o.grad_clip();
  if (o.has_shard_state()) c.optimizer.shard_state = o.shard_state();
  if (o.has_overlap()) c.optimizer.overlap = o.overlap();
  if (o.has_shard_grads()) c.optimizer.shard_grads = o.shard_grads();
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
  if (s.has_gpus()) c.gpus = s.gpus();
  if (s.has_device()) c.device = s.device();
  if (s.has_dtype()) c.dtype = s.dtype();
  if (s.has_fp32_master_weights()) c.fp32_master_weights = s.fp32_master_weights();
  if (s.has_seed()) c.seed = s.seed();
  if (s.has_log_every()) c.log_every = s.log_every();
  if (s.has_kernel_set()) {
    const auto k = ParseKernelSet(s.kernel_set());
    if (!k) {
      return absl::InvalidArgumentError(absl::StrCat("spec.kernel_set must be \"eager\" (LibTorch ops), \"fused\" "
                                                     "(ftd's CUDA kernels) or \"fp8\" (fused, with FP8 matmuls) (got ",
                                                     s.kernel_set(), ")"));
    }
    c.kernel_set = *k;
  }
  for (const auto& [op, impl] : s.kernels()) {
    const auto k = ParseKernelSet(impl);
    if (!k) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.kernels.", op, " must be \"eager\" or \"fused\"", op == "matmul" ? " or \"fp8\"" : "",
                       " (got ", impl, ")"));
    }
    c.kernels[op] = *k;
  }
  if (s.kernel_tuning().has_linear_cross_entropy_chunk_rows()) {
    c.kernel_tuning.linear_cross_entropy_chunk_rows = s.kernel_tuning().linear_cross_entropy_chunk_rows();
  }
  if (s.kernel_tuning().has_fused_projections()) c.kernel_tuning.fused_projections = s.kernel_tuning().fused_projections();
  if (s.kernel_tuning().has_cuda_graphs()) c.kernel_tuning.cuda_graphs = s.kernel_tuning().cuda_graphs();
  if (s.kernel_tuning().has_fp8_fast_accum()) c.kernel_tuning.fp8_fast_accum = s.kernel_tuning().fp8_fast_accum();
  if (s.has_activation_checkpointing()) {
    const auto a = ParseActivationCheckpointing(s.activation_checkpointing());
    if (!a) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.activation_checkpointing must be \"none\", \"selective\" (recompute RMSNorm outputs "
                       "and the SwiGLU product) or \"full\" (recompute each layer) (got ",
                       s.activation_checkpointing(), ")"));
    }
    c.activation_checkpointing = *a;
  }
  if (s.has_full_checkpoint_layers()) {
    if (s.full_checkpoint_layers() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.full_checkpoint_layers must be >= 0: how many of the first decoder layers are rerun in backward (got ",
          s.full_checkpoint_layers(), ")"));
    }
    if (s.full_checkpoint_layers() > 0 && c.activation_checkpointing == ActivationCheckpointing::kFull) {
      return absl::InvalidArgumentError(
          "spec.full_checkpoint_layers applies with activation_checkpointing \"none\" or \"selective\" (\"full\" "
          "already reruns every layer): drop one of the two");
    }
    c.full_checkpoint_layers = s.full_checkpoint_layers();
  }
  if (s.has_expandable_segments()) c.expandable_segments = s.expandable_segments();
  if (s.profile().has_warmup_steps()) c.profile.warmup_steps = s.profile().warmup_steps();
  if (s.profile().has_steps()) c.profile.steps = s.profile().steps();
  if (s.has_peak_flops()) c.peak_flops = s.peak_flops();
  if (s.has_lora()) {
    const auto& l = s.lora();
    c.lora.enabled = true;
    if (l.has_rank()) c.lora.rank = l.rank();
    if (l.has_alpha()) c.lora.alpha = l.alpha();
    if (l.has_dropout()) c.lora.dropout = l.dropout();
    if (l.target_modules_size() > 0) c.lora.target_modules.assign(l.target_modules().begin(), l.target_modules().end());
    if (l.has_init()) c.lora.init = l.init();
    if (l.has_use_rslora()) c.lora.use_rslora = l.use_rslora();
    if (l.has_dtype()) c.lora.dtype = l.dtype();
    if (l.has_merge()) c.lora.merge = l.merge();
    if (l.has_adapter_path()) c.lora.adapter_path = l.adapter_path();
  }
  if (auto st = c.Validate(); !st.ok()) return st;
  return c;
}

absl::StatusOr<TrainConfig> Validate(const ftd::v1::TrainSpec& spec, const Environment& env) {
  if (auto st = CheckMessage(spec, "spec"); !st.ok()) return st;
  auto c = ToTrainConfig(spec);
  if (!c.ok()) return c.status();
  if (auto st = CheckEnvironment(*c, env); !st.ok()) return st;
  return c;
}

KernelSet KernelSetOf(const ftd::v1::TrainSpec& s) {
  TrainConfig c;
  c.kernel_set = ParseKernelSet(s.kernel_set()).value_or(KernelSet::kEager);
  for (const auto& [op, impl] : s.kernels()) c.kernels[op] = ParseKernelSet(impl).value_or(KernelSet::kEager);
  return c.Kernels().Label();
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

}  // namespace ftd::spec
