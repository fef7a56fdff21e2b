#include "worker/engine/progress.h"

#include <utility>

namespace ftd::engine {

const char* ProgressPhaseName(ProgressPhase p) {
  switch (p) {
    case ProgressPhase::kLoadWeights: return "load_weights";
    case ProgressPhase::kLoadData: return "load_data";
    case ProgressPhase::kLoadCheckpoint: return "load_checkpoint";
    case ProgressPhase::kSaveCheckpoint: return "save_checkpoint";
  }
  return "?";
}

ProgressMeter::ProgressMeter(ProgressFn fn, ProgressPhase phase, uint64_t total_bytes,
                             std::chrono::steady_clock::duration interval)
    : fn_(std::move(fn)), interval_(interval) {
  p_.phase = phase;
  p_.total_bytes = total_bytes;
  Report();
}

void ProgressMeter::Add(uint64_t bytes) {
  p_.done_bytes += bytes;
  if (fn_ && std::chrono::steady_clock::now() - last_ >= interval_) Report();
}

void ProgressMeter::Finish() {
  if (finished_) return;
  finished_ = true;
  p_.done_bytes = p_.total_bytes;
  Report();
}

void ProgressMeter::Report() {
  last_ = std::chrono::steady_clock::now();
  if (fn_) fn_(p_);
}

}  // namespace ftd::engine
