#include "worker/agent.h"

#include <functional>
#include <iostream>
#include <mutex>

#include "proto/worker_link.h"
#include "worker/data/confined_open.h"
#include "worker/data/dataset_cache.h"
#include "worker/engine/engine.h"
#include "worker/engine/core/fs_util.h"
#include "spec/spec.h"
#include "worker/reports.h"

namespace ftd::worker {

namespace {

// Ranks 1..N-1 of a data-parallel job: they train and log to their output (the job's worker.log);
// rank 0 alone streams to the daemon, which sees the job's result there.
// Validates the assignment's spec for this machine and runs it with the hooks `prepare` sets.
engine::RunSummary ValidateAndTrain(const ftd::v1::TrainSpec& spec, const engine::RankInfo& rank,
                                    const std::function<void(spec::TrainConfig&, engine::RunHooks&)>& prepare) {
  auto config = spec::Validate(spec, engine::LocalEnvironment());
  if (!config.ok()) {
    engine::RunSummary summary;
    summary.outcome = engine::Outcome::kInvalidSpec;
    summary.message = std::string(config.status().message());
    return summary;
  }
  engine::RunHooks hooks;
  prepare(*config, hooks);
  return engine::RunTraining(*config, hooks, rank);
}

int RunFollowerRank(const AgentOptions& opts, const ftd::v1::TrainSpec& spec, std::atomic<bool>* stop,
                    const std::atomic<bool>* skip_checkpoint) {
  const engine::RunSummary summary = ValidateAndTrain(spec, opts.rank, [&](spec::TrainConfig&, engine::RunHooks& hooks) {
    hooks.on_log = [](std::string_view line) { std::cerr << "ftd-worker: " << line << std::endl; };
    hooks.stop = stop;
    hooks.skip_checkpoint = skip_checkpoint;
  });
  std::cerr << "ftd-worker agent: rank " << opts.rank.rank << ": " << engine::OutcomeName(summary.outcome) << ": "
            << summary.message << std::endl;
  return spec::ExitCode(summary.outcome);
}

}  // namespace

int RunAgent(const AgentOptions& opts, std::atomic<bool>* stop, const std::atomic<bool>* skip_checkpoint) {
  auto link = WorkerLink::Connect(opts.address, opts.job_id, opts.attempt, opts.token);
  if (!link.ok()) {
    std::cerr << "ftd-worker agent: " << link.status().message() << std::endl;
    return 1;
  }
  const ftd::v1::Assignment& assignment = (*link)->assignment();
  std::vector<ftd::data::OpenRoot> roots;
  for (const std::string& r : assignment.writable_roots()) roots.push_back({r, true, false});
  for (const std::string& r : assignment.read_only_roots()) roots.push_back({r, false, false});
  // Without data.cache_dir, prepared datasets go to the worker's own cache ($HOME/.cache/ftd/data):
  // one more writable root, left out where it cannot be made (the job then tokenizes uncached).
  if (!roots.empty() && assignment.spec().data().cache_dir().empty()) {
    roots.push_back({ftd::data::DefaultCacheDir(), true, true});
  }
  if (auto st = ftd::data::ConfineOpens(roots); !st.ok()) {
    std::cerr << "ftd-worker agent: " << st.message() << std::endl;
    return 1;
  }
  ftd::v1::TrainSpec spec = assignment.spec();
  const bool checkpoints = !spec.checkpoint().has_enabled() || spec.checkpoint().enabled();
  if (checkpoints && !spec.checkpoint().has_dir()) spec.mutable_checkpoint()->set_dir(assignment.checkpoint_dir());
  if (opts.rank.rank > 0) return RunFollowerRank(opts, spec, stop, skip_checkpoint);

  (*link)->Open();
  auto send = [&, l = link->get()](const ftd::v1::WorkerMessage& m) {
    if (!l->Send(m)) {
      if (!stop->exchange(true)) std::cerr << "ftd-worker agent: lost the daemon; stopping" << std::endl;
    }
  };

  // What the training thread did last, and a count that moves with it: each beat sends it as
  // progress when it moved, else a plain heartbeat (the daemon's watchdog tells the two apart).
  std::mutex progress_mu;
  ftd::v1::PhaseProgress progress;
  uint64_t moves = 0;
  auto moved = [&](const std::function<void(ftd::v1::PhaseProgress&)>& set) {
    std::lock_guard<std::mutex> l(progress_mu);
    set(progress);
    ++moves;
  };
  uint64_t sent_moves = 0;  // the heartbeat thread's only
  (*link)->StartHeartbeat(std::chrono::duration<double>(opts.heartbeat_s), [&] {
    ftd::v1::WorkerMessage m;
    std::lock_guard<std::mutex> pl(progress_mu);
    if (moves != sent_moves) {
      *m.mutable_progress() = progress;
      sent_moves = moves;
    } else {
      m.set_heartbeat(true);
    }
    return m;
  });

  const engine::RunSummary summary = ValidateAndTrain(spec, opts.rank, [&](spec::TrainConfig& config,
                                                                          engine::RunHooks& hooks) {
    hooks.on_step = [&](const engine::StepMetrics& m) {
      ftd::v1::WorkerMessage msg;
      *msg.mutable_step() = ToStepReport(m);
      send(msg);
    };
    hooks.on_log = [&](std::string_view line) {
      std::cerr << "ftd-worker: " << line << std::endl;
      ftd::v1::WorkerMessage msg;
      msg.set_log(std::string(line));
      send(msg);
    };
    hooks.on_step_done = [&](int64_t step) {
      moved([step](ftd::v1::PhaseProgress& p) {
        p.Clear();
        p.set_step(step);
        p.set_phase("train");
      });
    };
    hooks.stop = stop;
    hooks.skip_checkpoint = skip_checkpoint;
    // A load or checkpoint write that moved: sent at once (the daemon postpones a stop's kill while
    // a checkpoint write moves) and kept for the heartbeat thread (the progress watchdog).
    hooks.on_progress = [&](const engine::Progress& p) {
      ftd::v1::WorkerMessage msg;
      auto* pp = msg.mutable_progress();
      pp->set_phase(engine::ProgressPhaseName(p.phase));
      pp->set_done_bytes(static_cast<int64_t>(p.done_bytes));
      pp->set_total_bytes(static_cast<int64_t>(p.total_bytes));
      if (p.eta_s >= 0) pp->set_eta_s(p.eta_s);
      moved([pp](ftd::v1::PhaseProgress& kept) {
        pp->set_step(kept.step());  // the steps done, as the last step set it
        kept = *pp;
      });
      send(msg);
    };
    if (assignment.profile()) {
      config.profile.enabled = true;
      config.profile.trace_path = assignment.trace_path();
      const spec::KernelSet label = config.Kernels().Label();
      hooks.on_profile = [&, label](const engine::ProfileSummary& p) {
        ftd::v1::WorkerMessage msg;
        *msg.mutable_profile() = ToProfileReport(p, label);
        send(msg);
      };
    }
  });
  ftd::v1::WorkerMessage result;
  *result.mutable_result() = ToRunResult(summary);
  send(result);
  (*link)->Close();
  std::cerr << "ftd-worker agent: " << engine::OutcomeName(summary.outcome) << ": " << summary.message << std::endl;
  return spec::ExitCode(summary.outcome);
}

}  // namespace ftd::worker
