// ftd-worker: runs a training job. Standalone mode (`ftd-worker run SPEC.json`) runs a job spec
// file locally without a daemon and prints one JSON line per reported step, then one result line;
// progress lines ({"event": "progress", ...}) come while weights, data or a checkpoint load and
// while checkpoints are written. Logs go to stderr. Exit codes: 0 succeeded, 1 failed, 2 invalid
// spec, 3 GPU out of memory, 4 non-finite loss or gradient, 5 stopped by SIGINT/SIGTERM (after
// checkpointing, if configured) or by SIGUSR1 (at the next step, without a checkpoint: ftd's plain
// cancel). A run always ends with a result line on stdout and an "ftd-worker: exit N (OUTCOME)"
// line on stderr; an exit without them came from outside this file (worker/stop_signals.h writes
// its caller's stack).
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"
#include "worker/engine/core/token_data.h"
#include "worker/agent.h"
#include "spec/profile_table.h"
#include "spec/proto_json.h"
#include "spec/spec.h"
#include "worker/data/tokenize_cli.h"
#include "worker/reports.h"
#include "worker/stop_signals.h"

namespace {

// Set by the stop-signal thread (worker/stop_signals.h): SIGTERM/SIGINT stop after a checkpoint;
// SIGUSR1, ftd's plain cancel, stops at the next step without the checkpoint SIGTERM writes.
std::atomic<bool> g_stop{false};
std::atomic<bool> g_skip_checkpoint{false};

// The last line of every run on stderr: the exit code and the outcome it stands for.
int Exit(ftd::engine::Outcome outcome) {
  const int code = ftd::spec::ExitCode(outcome);
  std::cerr << "ftd-worker: exit " << code << " (" << ftd::engine::OutcomeName(outcome) << ")" << std::endl;
  ftd::worker::MarkResultReported();
  return code;
}

nlohmann::json StepJson(const ftd::engine::StepMetrics& m) {
  nlohmann::json j = {{"event", "step"}};
#define FTD_STEP_METRICS_JSON(type, name, meaning) \
  if (const auto v = ftd::engine::MetricValue(m.name)) j[#name] = *v; else j[#name] = nullptr;
  FTD_STEP_METRICS(FTD_STEP_METRICS_JSON)
#undef FTD_STEP_METRICS_JSON
  return j;
}

std::string StepText(const ftd::engine::StepMetrics& m) {
  constexpr double kGiB = 1 << 30;
  std::string out = absl::StrFormat("step %5d/%d  loss %.4f  grad_norm %.3f  lr %.2e  %.0f tokens/s  step %.3f s",
                                    m.step, m.total_steps, m.loss, m.grad_norm, m.lr, m.tokens_per_s, m.step_time_s);
  if (m.peak_mem_reserved_bytes > 0) {
    absl::StrAppendFormat(&out, "  gpu peak %.1f GiB alloc / %.1f GiB reserved",
                          static_cast<double>(m.peak_mem_allocated_bytes) / kGiB,
                          static_cast<double>(m.peak_mem_reserved_bytes) / kGiB);
  }
  absl::StrAppendFormat(&out, "  rss %.2f GiB", static_cast<double>(m.peak_rss_bytes) / kGiB);
  if (m.mfu > 0) absl::StrAppendFormat(&out, "  mfu %.1f%%", 100 * m.mfu);
  if (m.nvml_available) absl::StrAppendFormat(&out, "  %.0f W  %.3f J/token", m.power_w, m.joules_per_token);
  if (m.eval_loss) absl::StrAppendFormat(&out, "  eval_loss %.4f", *m.eval_loss);
  return out;
}

struct ProfileOptions {
  bool enabled = false;
  std::string trace;  // Chrome trace output path
  int top = 30;
  bool phase_times = false;  // log each step's phase GPU times (RunHooks::phase_times)
};

// The spec file (or the embedded default) with --set overrides, as a validated config; on failure
// the message is on stderr and the exit code in *exit_code.
std::optional<ftd::spec::TrainConfig> LoadConfig(const std::string& spec_path, bool use_default,
                                                 const std::vector<std::string>& sets, int* exit_code) {
  *exit_code = 2;
  ftd::v1::TrainSpec spec;
  if (use_default || spec_path.empty()) {
    spec = ftd::spec::DefaultTrainSpec(ftd::engine::CudaDeviceCount() > 0);
  } else {
    std::ifstream in(spec_path);
    if (!in) {
      std::cerr << "ftd-worker: cannot read spec file " << spec_path << "\n";
      return std::nullopt;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    auto parsed = ftd::spec::ParseTrainSpecJson(ss.str());
    if (!parsed.ok()) {
      std::cerr << "ftd-worker: " << spec_path << ": " << parsed.status().message() << "\n";
      return std::nullopt;
    }
    spec = *parsed;
  }
  // --set a.b=value overrides, applied through the JSON mapping so they are checked the same way.
  for (const auto& kv : sets) {
    if (auto st = ftd::spec::ApplySetOverride(kv, &spec); !st.ok()) {
      std::cerr << "ftd-worker: " << st.message() << "\n";
      return std::nullopt;
    }
  }
  auto config = ftd::spec::Validate(spec, ftd::engine::LocalEnvironment());
  if (!config.ok()) {
    std::cout << nlohmann::json{{"event", "result"}, {"outcome", "INVALID_SPEC"}, {"message", config.status().message()}}
                     .dump()
              << std::endl;
    std::cerr << "ftd-worker: " << config.status().message() << "\n";
    return std::nullopt;
  }
  *exit_code = 0;
  return *std::move(config);
}

// `ftd-worker prepare`: tokenizes the spec's JSONL data (and held-out file) into the prepared-
// dataset cache, or finds it there, and prints one JSON line per file.
int Prepare(const std::string& spec_path, const std::vector<std::string>& sets, bool progress) {
  int code = 0;
  auto config = LoadConfig(spec_path, false, sets, &code);
  if (!config) return code;
  ftd::spec::DataConfig d = config->data;
  if (!d.jsonl()) {
    std::cerr << "ftd-worker prepare: data.format is \"" << d.format
              << "\"; only the JSONL formats (text, prompt_completion, chat) are tokenized ahead\n";
    return 2;
  }
  if (d.tokenizer_path.empty()) d.tokenizer_path = config->model.weights_path;
  for (const std::string& path : {d.path, d.eval_path}) {
    if (path.empty()) continue;
    auto req = ftd::engine::PrepareRequestFor(d, path);
    if (!req.ok()) {
      std::cerr << "ftd-worker prepare: " << req.status().message() << "\n";
      return 2;
    }
    req->parallel.progress = progress;
    auto prepared = ftd::data::PrepareJsonl(*req);
    if (!prepared.ok()) {
      std::cerr << "ftd-worker prepare: " << prepared.status().message() << "\n";
      return absl::IsInvalidArgument(prepared.status()) || absl::IsNotFound(prepared.status()) ? 2 : 1;
    }
    if (!prepared->cache_error.empty()) {
      std::cerr << "ftd-worker prepare: " << prepared->cache_error << "\n";
      return 1;
    }
    const auto& c = prepared->corpus;
    std::cout << nlohmann::json{{"event", "prepared"},
                                {"path", path},
                                {"cache", prepared->dir},
                                {"reused", prepared->reused},
                                {"examples", c.num_docs()},
                                {"tokens", c.ids.size()},
                                {"loss_tokens", c.loss_tokens()},
                                {"lines", c.lines},
                                {"bad_lines", c.bad_line_count},
                                {"bad_lines_summary", c.bad_lines_summary}}
                     .dump()
              << std::endl;
  }
  return 0;
}

int Run(const std::string& spec_path, bool use_default, const std::vector<std::string>& sets, bool text,
        const ProfileOptions& prof, const ftd::engine::RankInfo& rank) {
  int code = 0;
  auto config = LoadConfig(spec_path, use_default, sets, &code);
  if (!config) {
    ftd::worker::MarkResultReported();
    return code;
  }
  if (prof.enabled) {
    config->profile.enabled = true;
    config->profile.trace_path = prof.trace;
  }
  ftd::engine::RunHooks hooks;
  const ftd::spec::KernelSet kernel_label = config->Kernels().Label();
  hooks.on_profile = [&](const ftd::engine::ProfileSummary& p) {
    const auto report = ftd::worker::ToProfileReport(p, kernel_label);
    if (text) {
      std::cout << ftd::spec::ProfileTable(report, prof.top) << std::flush;
    } else {
      std::cout << "{\"event\": \"profile\", \"profile\": "
                << ftd::spec::MessageToJsonValue(report, /*every_field=*/false).dump() << "}" << std::endl;
    }
  };
  hooks.on_step = [text](const ftd::engine::StepMetrics& m) {
    std::cout << (text ? StepText(m) : StepJson(m).dump()) << std::endl;
  };
  hooks.on_log = [](std::string_view line) { std::cerr << "ftd-worker: " << line << std::endl; };
  if (!text) {
    hooks.on_progress = [](const ftd::engine::Progress& p) {
      nlohmann::json j{{"event", "progress"},
                       {"phase", ftd::engine::ProgressPhaseName(p.phase)},
                       {"done_bytes", p.done_bytes},
                       {"total_bytes", p.total_bytes}};
      if (p.eta_s >= 0) j["eta_s"] = p.eta_s;
      std::cout << j.dump() << std::endl;
    };
  }
  hooks.stop = &g_stop;
  hooks.skip_checkpoint = &g_skip_checkpoint;
  hooks.phase_times = prof.phase_times;
  if (config->gpus > 1 && rank.store_path.empty()) {
    std::cerr << "ftd-worker: spec.gpus is " << config->gpus << ": start one process per rank, each with --rank R "
              << "(0.." << config->gpus - 1 << ") and the same new --store file (docs/distributed.md)\n";
    ftd::worker::MarkResultReported();
    return 2;
  }
  ftd::worker::SetStage("training");
  const auto sum = ftd::engine::RunTraining(*config, hooks, rank);
  ftd::worker::SetStage("writing the result");
  std::cout << nlohmann::json{{"event", "result"},
                              {"outcome", ftd::engine::OutcomeName(sum.outcome)},
                              {"message", sum.message},
                              {"steps_done", sum.steps_done},
                              {"final_loss", sum.final_loss},
                              {"final_eval_loss", sum.final_eval_loss ? nlohmann::json(*sum.final_eval_loss)
                                                                      : nlohmann::json()},
                              {"last_checkpoint", sum.last_checkpoint},
                              {"rank_grad_bytes", sum.rank_grad_bytes}}
                   .dump()
            << std::endl;
  if (!std::cout) std::cerr << "ftd-worker: writing to stdout failed: " << std::strerror(errno) << "\n";
  if (sum.outcome != ftd::engine::Outcome::kSucceeded) {
    std::cerr << "ftd-worker: " << ftd::engine::OutcomeName(sum.outcome) << ": " << sum.message << "\n";
  }
  return Exit(sum.outcome);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ftd-worker: the ftd training engine (LLaMA on LibTorch)"};
  app.require_subcommand(1);
  std::string spec_path;
  bool use_default = false, gpu = false;
  std::string format = "json";
  std::vector<std::string> sets;
  auto* run = app.add_subcommand("run", "Run a job spec file locally and print one JSON line per step");
  run->add_option("spec", spec_path, "TrainSpec JSON file (docs/job-spec.md)");
  run->add_flag("--default", use_default, "Run the embedded default job (the same as giving no spec)");
  run->add_option("--format", format, "json (one object per line) or text")->check(CLI::IsMember({"json", "text"}));
  run->add_option("--set", sets, "Override a spec field, e.g. --set steps=20 --set optimizer.lr=1e-3");
  ProfileOptions prof;
  ftd::engine::RankInfo rank;
  run->add_option("--rank", rank.rank, "spec.gpus > 1: this process's rank (0 writes the model and reports)");
  run->add_option("--store", rank.store_path, "spec.gpus > 1: the c10d file store the ranks meet at (a new path per run)");
  run->add_option("--rank-timeout", rank.timeout_s, "spec.gpus > 1: seconds a rank waits for the others");
  run->add_option("--bucket-mib", rank.bucket_mib, "spec.gpus > 1: gradient all-reduce bucket size in MiB (default 256)")
      ->check(CLI::Range(1, 65536));
  run->add_flag("--coalesced-gather", rank.coalesced_gather,
                "spec.gpus > 1 with optimizer.shard_state: send the updated weights as one coalesced group of "
                "broadcasts where the backend can (NCCL), instead of one broadcast after another");
  run->add_flag("--flat-reduce", rank.flat_reduce,
                "spec.gpus > 1 without optimizer.shard_grads: copy each bucket's gradients into one flat tensor and "
                "all-reduce that (the default all-reduces them where they are, as one coalesced group)");
  run->add_flag("--phase-times", prof.phase_times,
                "GPU runs: log the GPU time of each phase of every step (CUDA events, no extra synchronisation)");
  auto* profile = app.add_subcommand("profile", "Profile a job spec locally: warm-up steps, then profiled steps; "
                                                "prints the per-op table (spec.profile sets the step counts)");
  profile->add_option("spec", spec_path, "TrainSpec JSON file (docs/job-spec.md)");
  profile->add_flag("--default", use_default, "Profile the embedded default job");
  profile->add_option("--set", sets, "Override a spec field, e.g. --set kernel_set=fused");
  profile->add_option("--trace", prof.trace, "Write the Chrome/Perfetto trace to this file");
  profile->add_option("--top", prof.top, "Rows of the table (0: all)");
  std::string profile_format = "text";
  profile->add_option("--format", profile_format, "text (steps and the table) or json (one object per line)")
      ->check(CLI::IsMember({"json", "text"}));
  auto* def = app.add_subcommand("default-spec", "Print the embedded default job spec as JSON");
  def->add_flag("--gpu", gpu, "The GPU variant (the LLaMA-3.1-8B shape)");
  ftd::worker::AgentOptions agent_opts;
  auto* agent = app.add_subcommand("agent", "Run one job attempt for the ftd daemon (started by ftd, not by hand)");
  agent->add_option("--address", agent_opts.address, "the daemon's worker socket")->required();
  agent->add_option("--job", agent_opts.job_id, "job id")->required();
  agent->add_option("--attempt", agent_opts.attempt, "attempt number")->required();
  // The attempt's token comes in $FTD_ATTEMPT_TOKEN: a command line shows in `ps`.
  agent->add_option("--rank", agent_opts.rank.rank, "rank of a data-parallel job (0: talks to the daemon)");
  agent->add_option("--store", agent_opts.rank.store_path, "the attempt's c10d file store (data-parallel jobs)");
  auto* prepare = app.add_subcommand("prepare", "Tokenize a spec's JSONL dataset once into the prepared-dataset cache "
                                                "that jobs reuse (docs/data-format.md)");
  prepare->add_option("spec", spec_path, "TrainSpec JSON file (docs/job-spec.md)")->required();
  prepare->add_option("--set", sets, "Override a spec field, e.g. --set data.cache_dir=/data/cache");
  bool no_progress = false;
  prepare->add_flag("--no-progress", no_progress, "No progress bar on stderr");
  auto tokenize = ftd::data::AddTokenizeCommand(&app);
  CLI11_PARSE(app, argc, argv);
  // NVLink multicast stays off in every process (NCCL's NVLS, symmetric memory, NVSHMEM): on shared
  // GPU machines it can take the host's GPUs out of service. Set before any thread starts.
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  ::setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
  ::setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
  if (*run || *profile || *agent) {
    // Before anything starts a thread (LibTorch, CUDA, NVML, gRPC), so that every thread inherits
    // the blocked stop signals.
    ftd::worker::StartStopSignalThread(&g_stop, &g_skip_checkpoint);
    ftd::worker::InstallExitWatch();
    ftd::worker::SetStage("reading the spec");
  }
  if (*prepare) return Prepare(spec_path, sets, !no_progress);
  if (*tokenize->cmd) return ftd::data::RunTokenizeCommand(*tokenize);
  if (*agent) {
    const char* token = std::getenv("FTD_ATTEMPT_TOKEN");
    if (token == nullptr || *token == '\0') {
      std::cerr << "ftd-worker agent: $FTD_ATTEMPT_TOKEN is not set (ftd starts agents; not for use by hand)\n";
      ftd::worker::MarkResultReported();
      return 2;
    }
    agent_opts.token = token;
    ::unsetenv("FTD_ATTEMPT_TOKEN");  // not inherited by anything the worker starts
    ::umask(077);  // checkpoints, traces and caches it writes are the job owner's only
    ftd::worker::SetStage("running the agent");
    const int code = ftd::worker::RunAgent(agent_opts, &g_stop, &g_skip_checkpoint);
    ftd::worker::MarkResultReported();
    return code;
  }
  if (*def) {
    std::cout << ftd::spec::TrainSpecToJson(ftd::spec::DefaultTrainSpec(gpu)) << std::endl;
    return 0;
  }
  if (*profile) {
    prof.enabled = true;
    return Run(spec_path, use_default, sets, profile_format == "text", prof, {});
  }
  return Run(spec_path, use_default, sets, format == "text", prof, rank);
}
