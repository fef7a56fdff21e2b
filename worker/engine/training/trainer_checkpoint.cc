// Writing a training run's checkpoint: skipped where the state is the one last written or resumed
// from, each write's progress reported with its predicted time left, a plain cancel that comes
// mid-write honoured on one rank, and with several ranks the barriers that let every rank know the
// checkpoint (and, under ZeRO, each rank's optimizer shard) is in place.
#include "worker/engine/training/training_run.h"

#include <filesystem>
#include <functional>

#include "absl/strings/str_format.h"

namespace ftd::engine {

bool TrainingRun::Checkpoint() {
  if (cfg_.checkpoint.dir.empty()) return true;
  // The last step's checkpoint also holds the merged model when spec.lora.merge asks for it.
  const bool merged = model_->lora() && cfg_.lora.merge && state_.step == cfg_.steps;
  // Nothing to write where the state is that of the checkpoint just written or resumed from
  // (unless that one lacks the merged model this one should hold).
  if (state_.step == saved_step_ && (!merged || std::filesystem::exists(sum_.last_checkpoint + "/merged"))) {
    return true;
  }
  // Each write's progress carries the predicted time left (the daemon waits that long for a
  // stopping worker, and ftctl shows it).
  ProgressFn progress;
  if (hooks_.on_progress) {
    progress = [this](const Progress& p) {
      Progress with_eta = p;
      with_eta.eta_s = write_eta_.Observe(p, std::chrono::steady_clock::now());
      hooks_.on_progress(with_eta);
    };
  }
  // A plain cancel (stop without a checkpoint) that comes mid-write stops the write too.
  auto plain_cancel = [this] {
    return hooks_.stop != nullptr && hooks_.stop->load() && hooks_.skip_checkpoint != nullptr &&
           hooks_.skip_checkpoint->load();
  };
  const auto t0 = std::chrono::steady_clock::now();
  // Data parallel: rank 0 writes the checkpoint; under ZeRO-1 every rank writes its optimizer
  // shard into it (CheckpointRanks). The others learn it is in place at the barrier. With several
  // ranks a plain cancel does not stop the write: every rank must reach the same barriers, so the
  // write runs to its end and the ranks stop after it.
  absl::StatusOr<std::string> dir;
  if (world_ > 1 && owner_.empty() && !lead()) {
    ranks_->Barrier();
    dir = (std::filesystem::path(cfg_.checkpoint.dir) / absl::StrFormat("step-%08d", state_.step)).string();
  } else {
    CheckpointRanks cr;
    if (!owner_.empty()) cr = {rank_.rank, world_, [this] { ranks_->Barrier(); }};
    std::function<bool()> abort;
    if (world_ == 1) abort = plain_cancel;
    dir = SaveCheckpoint(cfg_.checkpoint.dir, state_, *model_, *opt_, cfg_.checkpoint.keep_last, merged, progress,
                         std::move(abort), cr);
    if (dir.ok() && world_ > 1 && owner_.empty()) ranks_->Barrier();
  }
  if (absl::IsCancelled(dir.status())) {
    return Fail(Outcome::kCancelled, absl::StrCat("stopped on request while writing the checkpoint of step ",
                                                  state_.step, ", without a checkpoint"));
  }
  if (!dir.ok()) return Fail(Outcome::kFailed, std::string(dir.status().message()));
  sum_.last_checkpoint = *dir;
  saved_step_ = state_.step;
  Log(absl::StrFormat("checkpoint %s (written in %.1f s)", *dir,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  return true;
}

}  // namespace ftd::engine
