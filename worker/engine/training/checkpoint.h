// Atomic, resumable checkpoints (docs/checkpoint-format.md).
//
//   <root>/step-00000042/          a complete checkpoint (renamed into place last)
//     model.safetensors (+ its index), config.json, generation_config.json, the tokenizer files:
//       a complete HF model directory (LlamaModel::hf_files()) that transformers loads
//       (LoRA instead: adapter_model.safetensors, adapter_config.json in PEFT's format, and with
//       `merged` a merged/ directory holding the merged model's weights and the same files)
//     optimizer.safetensors            AdamW state under fixed names, and RNG states
//     trainer_state.json               step, data cursor, shapes the cursor depends on
//     MANIFEST.json                    written last: format, step, every file and its size
// Writing holds an exclusive flock on <root>, removes partial checkpoints (`step-*.tmp`) that dead
// writers left, writes step-N.tmp/, fsyncs every file, writes and fsyncs the manifest, fsyncs the
// directory, renames it to step-N (exchanging it atomically with an older step-N) and fsyncs <root>;
// then prunes to keep_last. A loader takes the newest directory whose manifest is present and whose
// files have the sizes it lists; anything else (a crash mid-write) is ignored.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/model/model.h"
#include "worker/engine/training/optimizer.h"
#include "worker/engine/core/progress.h"

namespace ftd::engine {

struct TrainerState {
  int64_t step = 0;           // optimizer steps completed
  int64_t micro_batches = 0;  // data cursor: micro-batches consumed
  int64_t tokens_total = 0;
  // What the data cursor's meaning depends on; a resume with other values is refused.
  int64_t batch_size = 0, seq_len = 0;  // batch_size: of all ranks together (spec.batch_size x gpus)
  bool shuffle = false;
  uint64_t data_seed = 0;
  std::string data_path;
};

// The ranks of a data-parallel job whose optimizer state is sharded (ZeRO-1): rank 0 writes the
// model, the trainer state and the manifest; every rank writes its shard of the optimizer state
// as optimizer-rank-<r>-of-<n>.safetensors into step-N.tmp/ between two barriers, and the manifest
// (written last) lists them all. Unsharded data-parallel jobs checkpoint from rank 0 alone.
struct CheckpointRanks {
  int rank = 0, world = 1;
  std::function<void()> barrier;  // every rank of the job meets here (throws if one is gone)
};

// Writes the checkpoint of `state.step` and returns its directory. `merged` (LoRA only): also write
// merged/ (the base with the adapters merged into it). keep_last > 0 then keeps that one and the
// keep_last - 1 newest other complete checkpoints, removing the rest. Reports kSaveCheckpoint
// progress through `progress` (may be empty). When `abort` (may be empty) turns true mid-write, the
// write stops at the next piece boundary, its .tmp directory is removed and the result is
// CANCELLED; any other failure also removes the .tmp directory. With ranks.world > 1 `abort` is
// ignored: every rank must reach the same barriers, so a sharded write always runs to its end.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& root, const TrainerState& state,
                                           const LlamaModel& model, const AdamW& opt, int keep_last,
                                           bool merged = false, const ProgressFn& progress = {},
                                           std::function<bool()> abort = {}, const CheckpointRanks& ranks = {});
// The newest complete checkpoint under root, or nullopt if there is none.
absl::StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& root);
// Loads a checkpoint written with the same data settings as `state` (refused otherwise with
// InvalidArgument naming the field: the spec's to fix, as is a checkpoint of another kind or shape). The optimizer state is looked up by name in every optimizer file of the checkpoint, so a
// sharded one loads into any number of ranks (re-sharding) and into an unsharded run. Reports kLoadCheckpoint progress through `progress` (may be empty).
absl::Status LoadCheckpoint(const std::string& dir, TrainerState* state, LlamaModel* model, AdamW* opt,
                            const ProgressFn& progress = {});

}  // namespace ftd::engine
