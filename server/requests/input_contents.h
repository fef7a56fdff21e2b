// What ftd reads of a job's input files at submit, beyond their types (spec/input_files.h), so that
// a job that would fail at its start is refused before its wait in the queue:
//   - a token file (data.format "tokens") that holds JSON lines: refused naming data.format;
//   - a JSONL file's lines, checked by the worker's own rules (spec/jsonl_example.h): all of a file
//     up to kJsonlCheckBytes, else its first kJsonlCheckBytes of whole lines (the worker checks the
//     rest at the start); bad lines are refused under data.on_bad_line "refuse";
//   - a PEFT adapter's adapter_config.json (lora.adapter_path): settings ftd does not implement, and
//     an adapter that does not match spec.lora (spec/lora_config.h).
// Each check that passes leaves a note saying what it covered, for `ftctl submit --dry-run`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "spec/train_config.h"

namespace ftd::server {

// The most of a JSONL file read at submit.
inline constexpr int64_t kJsonlCheckBytes = int64_t{16} << 20;

struct InputContentOptions {
  // Whether a bad line's reason (which may quote the line) may be told: false for a file under a
  // read-only root, which may be another user's (docs/security.md).
  bool may_quote = true;
  int64_t jsonl_check_bytes = kJsonlCheckBytes;
};

// INVALID_ARGUMENT naming the field and the fix; `notes` gets one line per file checked. Inputs
// that cannot be opened are left to the worker (CheckInputFiles refused the missing ones).
absl::Status CheckInputContents(const spec::TrainConfig& c, const InputContentOptions& options,
                                std::vector<std::string>* notes);

}  // namespace ftd::server
